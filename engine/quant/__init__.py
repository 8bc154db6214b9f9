"""8-bit DiT weights (``--quant``): modes, kernels, the quantized linear and quantized checkpoints."""

from engine.quant.dit import quantize_linears, quantized_skeleton, run_mode, stored_quant, weight_bytes
from engine.quant.kernels import check_quant_device, int8_path
from engine.quant.linear import QuantLinear
from engine.quant.modes import QUANT_MODES, QuantMode, parse_quant

__all__ = [
    "QUANT_MODES",
    "QuantLinear",
    "QuantMode",
    "check_quant_device",
    "int8_path",
    "parse_quant",
    "quantize_linears",
    "quantized_skeleton",
    "run_mode",
    "stored_quant",
    "weight_bytes",
]
