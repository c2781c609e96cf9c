"""What only operators' tools and synth run, never a function, so the Lambda layer leaves it out
(infra/layer_contents.py): ``lmctl verify`` and its invariant catalogue, the cost model, ``lmctl
conflicts show``'s identity view, ``lmctl env --stack``'s outputs and the state machines'
definitions (rendered at synth and by the local runtime)."""
