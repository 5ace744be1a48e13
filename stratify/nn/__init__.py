"""Neural network models and the sum-based BatchNorm."""
