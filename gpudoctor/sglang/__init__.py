"""SGLang launch-argument validation: catch misconfiguration before a 10-minute model load."""

from gpudoctor.sglang.validate import ValidationResult, strip_launcher, validate

__all__ = ["ValidationResult", "strip_launcher", "validate"]
