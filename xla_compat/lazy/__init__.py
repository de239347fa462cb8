"""The shared lazy core: IR nodes, LazyTensor and the tracer that turns aten calls into IR."""
