"""TAEHV in Matrix-Game 2.0 against the Wan VAE, on the golden case (tests/golden/matrixgame2_tiny):
the first-image conditioning's latents (TAEHV's encoder vs the VAE's) and the video (TAEHV's decode vs
the VAE's) of the same latents, side by side in one run.

    python bench/matrixgame_taehv.py

Both sides have **random weights** (the golden case's tiny Wan VAE, dim 4; TAEHV the golden
taew2_1_tiny file, full size), so the differences say how far two unrelated random networks are
apart, not how well the released taew2_1 matches the released Wan 2.1 VAE: that needs the released
weights, which cannot be downloaded here. What the run does show: the VAE path reproduces the
golden conditioning (its error is printed first), and the TAEHV paths run end to end on the case's
shapes. Errors are max abs and RMS; latents in the VAE's normalized space, video in [0, 1].
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from engine.decoders.taehv import load_taehv
from engine.families.matrixgame.conditioning import image_latents, taehv_image_latents
from engine.families.matrixgame.golden import MatrixGameCase

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden"


def _errors(got: torch.Tensor, want: torch.Tensor) -> str:
    diff = (got.float() - want.float()).flatten()
    rms, rms_want = diff.pow(2).mean().sqrt().item(), want.float().pow(2).mean().sqrt().item()
    return f"max abs {diff.abs().max().item():.3e}  RMS {rms:.3e}  (RMS of the VAE's {rms_want:.3e})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", type=Path, default=GOLDEN / "matrixgame2_tiny")
    parser.add_argument("--taehv", type=Path, default=GOLDEN / "taew2_1_tiny" / "taew2_1.pth")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    case = MatrixGameCase(args.case)
    golden, outputs = case.tensors("conditioning"), case.tensors("outputs")
    image = case.tensors("inputs")["image"][:, :, 0]  # [1, 3, H, W] in [-1, 1]
    latents = outputs["latents"].transpose(1, 2)  # [1, F, 16, h, w]
    video = outputs["video"]  # [1, T, 3, H, W] in [-1, 1]
    frames = golden["img_cond"].shape[2]
    vae, taehv = case.vae(), load_taehv(args.taehv)
    with torch.no_grad():
        began = time.process_time()
        by_vae = image_latents(vae, image, frames)
        vae_s = time.process_time() - began
        began = time.process_time()
        by_taehv = taehv_image_latents(taehv, image, frames)
        taehv_s = time.process_time() - began
        decoded = taehv.decode_video(latents.half().float())
    print(f"case {args.case.name}: image {tuple(image.shape[2:])}, {frames} latent frames, random weights both sides")
    print(f"conditioning, VAE encoder vs golden img_cond:   {_errors(by_vae.transpose(1, 2), golden['img_cond'])}")
    print(f"conditioning, TAEHV encoder vs VAE encoder:     {_errors(by_taehv, by_vae)}")
    print(f"video [0, 1], TAEHV decode vs golden VAE video: {_errors(decoded, (video + 1) / 2)}")
    print(f"encode CPU ms (tiny VAE dim 4 vs TAEHV full size): VAE {1e3 * vae_s:.1f}  TAEHV {1e3 * taehv_s:.1f}")


if __name__ == "__main__":
    main()
