"""User-facing errors: every one is a ValueError with a single-line message."""


class TpvizError(ValueError):
    """Base of every error a user can cause; str(e) is one line naming the problem."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class TPSizeError(TpvizError):
    """A tp size the model cannot be split by under the chosen rules: `quantity`=`value` does not divide by
    `tp` when those are known; `generic` marks a layer's own size name (output_size...), not a config key."""

    def __init__(self, message: str, quantity: str | None = None, value: int | None = None,
                 tp: int | None = None, generic: bool = False, reason: str | None = None):
        super().__init__(message)
        self.quantity, self.value, self.tp, self.generic = quantity, value, tp, generic
        self.reason = reason or message  # the rule alone, without advice appended to the message


class QuantError(TPSizeError):
    """A tp size a quantized layer cannot be split by (vLLM's block or group checks); the layer is named."""


class ConfigError(TpvizError):
    """A config that is malformed, incomplete or of an unsupported architecture."""


class MissingFieldError(ConfigError):
    """A config without a field its architecture needs (`field`)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class NotJSONError(ConfigError):
    """Bytes that are not a JSON config at all (not UTF-8, not valid JSON)."""


class SourceError(TpvizError):
    """A model source (path, upload, preset, hub id) that cannot be read."""


class HubError(SourceError):
    """The Hugging Face hub is offline, the repo is missing, or it is gated."""


class WeightsError(SourceError):
    """Checkpoint weights that are missing or do not match the config."""


class TensorError(WeightsError):
    """A problem with one checkpoint tensor, whose message already names it."""


class TPGroupError(TpvizError):
    """A process group whose size is not the layer's tp_size: its collectives would be wrong or skipped."""


class LayoutError(TpvizError):
    """A tp x pp x dp (x ep) layout that cannot exist for this model or GPU count."""


class DenseEPError(LayoutError):
    """Expert parallelism asked of a model without routed experts."""
