"""Engine configuration: vLLM's knob names and defaults, strict loading and validation."""

from aisim.config.engine import EngineConfig, TimeModel, engine_config_from_dict, load_engine_config

__all__ = ["EngineConfig", "TimeModel", "engine_config_from_dict", "load_engine_config"]
