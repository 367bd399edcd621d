"""Named variants. A preset is just a spec under a memorable name."""
from ablate.variants.spec import make_variant
from ablate.variants.tables import PRESETS

PRESETS.register("gpt2")(make_variant())  # the ANDREA-120M / GPT-2 block
PRESETS.register("andrea")(make_variant())
PRESETS.register("post-ln")(make_variant(norm="post"))  # Vaswani et al. 2017
PRESETS.register("sandwich-ln")(make_variant(norm="sandwich"))
PRESETS.register("deepnet")(make_variant(norm="deepnorm"))
PRESETS.register("llama")(make_variant(norm_type="rmsnorm", mlp="swiglu"))
PRESETS.register("no-norm")(make_variant(norm="none"))
