"""The refusals SGLang 0.5.23's model files share, as Groups.check functions (spec, layout) or parts of one:
each returns the file's problem with the config, or None."""


def mha_only(spec, layout=None) -> str | None:
    """q/k/v built from num_attention_heads alone: no num_key_value_heads read (olmo.py, phi.py)."""
    if spec.num_key_value_heads != spec.num_attention_heads:
        return (f"builds as many KV heads as query heads (it reads no num_key_value_heads), so this config's "
                f"{spec.num_key_value_heads} KV heads for {spec.num_attention_heads} would not load")
    return None


def derived_head_dim(spec, layout=None) -> str | None:
    """head_dim taken as hidden_size // num_attention_heads (commandr.py, exaone4.py)."""
    if spec.head_dim * spec.num_attention_heads != spec.hidden_size:
        return (f"takes head_dim = hidden_size // num_attention_heads, not this config's {spec.head_dim}: "
                "not modelled")
    return None


def logits_from(embed: str):
    """The check of a file whose logits read the embedding whatever tie_word_embeddings says (gemma.py's
    embed_tokens, gpt2.py's and gpt_bigcode.py's wte): an untied checkpoint's lm_head is never loaded."""
    def check(spec, layout=None) -> str | None:
        if not spec.tie_word_embeddings:
            return (f"reads the logits off {embed} whatever tie_word_embeddings says: an untied checkpoint "
                    "is not modelled")
        return None
    return check
