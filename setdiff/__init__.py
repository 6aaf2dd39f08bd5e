"""setdiff: set diffusion language models and their baselines."""
