"""Matrix-Game 2.0: the image-to-world causal Wan DiT with its keyboard / mouse action module."""
