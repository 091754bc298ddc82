"""The hot path: a module called again and again, and its optimizer's step, compiled whole
instead of recorded op by op (docs/engine.md, "A module call's walk"): the global module hooks,
hot calls and their architectures, their backward and optimizer steps, the rent-or-buy payoff
they share, the captured graph run while the worker compiles it, and a trained model compiled
whole where the runtime fuses by itself (TorchTPU: trained modules)."""
