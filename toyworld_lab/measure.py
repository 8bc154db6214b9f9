"""Reading a toyworld video back from its pixels: where the objects are, what colour they are.

Used by the tests (does the video follow its prompt?) and by `bench/toyworld.py` (drift over a
minute against the simulator). A pixel belongs to an object when it is far from the background
colour; an object's colour is the palette word nearest to the mean of its strongly coloured pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toyworld_lab.world import BACKGROUND, PALETTE

OBJECT_DISTANCE = 80.0  # RGB distance from the background beyond which a pixel is an object's
MIN_AREA = 12  # pixels: less than this is no object (a ball of radius 5 covers ~79)
_NAMES = list(PALETTE)
_COLOURS = np.array([PALETTE[n] for n in _NAMES], np.float32)


@dataclass(frozen=True)
class FrameReading:
    area: int  # object pixels
    centroid: tuple[float, float] | None  # (x, y) of the object pixels, None when there are none
    colour: str | None  # nearest palette word of the object pixels, None when there is no object
    colour_error: float  # RGB distance of the mean object colour to that palette entry

    @property
    def present(self) -> bool:
        return self.area >= MIN_AREA


def object_mask(frame: np.ndarray) -> np.ndarray:
    """bool [H, W]: pixels far from the background colour."""
    distance = np.linalg.norm(frame.astype(np.float32) - np.array(BACKGROUND, np.float32), axis=-1)
    return distance > OBJECT_DISTANCE


def nearest_colour(rgb: np.ndarray) -> tuple[str, float]:
    distances = np.linalg.norm(_COLOURS - rgb.astype(np.float32), axis=1)
    best = int(np.argmin(distances))
    return _NAMES[best], float(distances[best])


def read_frame(frame: np.ndarray) -> FrameReading:
    """What one uint8 [H, W, 3] frame shows."""
    mask = object_mask(frame)
    area = int(mask.sum())
    if area == 0:
        return FrameReading(0, None, None, float("nan"))
    ys, xs = np.nonzero(mask)
    colour, error = nearest_colour(frame[mask].reshape(-1, 3).mean(axis=0))
    return FrameReading(area, (float(xs.mean()) + 0.5, float(ys.mean()) + 0.5), colour, error)


def dominant_colour(frames: np.ndarray) -> str | None:
    """The palette word of most object pixels over frames [T, H, W, 3] (per-pixel vote)."""
    mask = np.stack([object_mask(f) for f in frames])
    if mask.sum() < MIN_AREA:
        return None
    pixels = frames[mask].astype(np.float32)
    votes = np.argmin(np.linalg.norm(pixels[:, None, :] - _COLOURS[None], axis=-1), axis=1)
    return _NAMES[int(np.bincount(votes, minlength=len(_NAMES)).argmax())]


__all__ = ["MIN_AREA", "FrameReading", "dominant_colour", "nearest_colour", "object_mask", "read_frame"]
