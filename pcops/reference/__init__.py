"""Plain-PyTorch reference implementations: the CPU path of every op and the test oracle."""
