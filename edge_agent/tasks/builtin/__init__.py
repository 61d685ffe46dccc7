"""Tasks this package ships, written against the same contract as users' tasks and registered in the
same entry-point group (see pyproject.toml): 8x8 digits (the fast default), MNIST-5k, BasicMotions."""
