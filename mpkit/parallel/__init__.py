"""``mpkit.parallel``: the mechanisms the labs teach, usable on any ``nn.Module`` in any process group."""
