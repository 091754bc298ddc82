"""Groups: what a flushed trace becomes (docs/engine.md, "An op's walk", from the flush on): its
key and FX graph, the plan that says whether it replays or compiles, the cache of its variants,
the compiler and the background worker that compiles it, and Inductor's disk cache."""
