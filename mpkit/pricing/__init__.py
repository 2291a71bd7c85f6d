"""Layer 7 (ARCHITECTURE.md): a model piece's op counts on the meta device (``profile``) and the
prices of a strategy's program (``pricing``), which the strategies build their programs with."""
