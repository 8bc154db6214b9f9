"""What golden parity means: the largest absolute difference allowed between the engine and the
reference code's vectors (`shared/golden`, fp32 on the CPU)."""

GOLDEN_TOLERANCE = 1e-5
