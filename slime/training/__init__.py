"""Training-side pieces shared by every trainer backend (loss, ...). Import submodules directly."""
