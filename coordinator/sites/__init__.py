"""Site aggregators: a process at a site folds its agents' updates into one partial aggregate per family and round."""
