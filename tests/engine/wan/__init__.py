"""Tests of the Wan family (engine/families/wan): Self Forcing, CausVid, LongLive, toyworld."""
