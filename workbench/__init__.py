"""workbench: collect latent trajectories of a recurrent-depth model and analyse them."""
