"""What several benchmarks share."""

from __future__ import annotations

from sepo.paths import CONF_DIR


def compose(overrides: list[str]):
    """The project's Hydra config with `overrides`, outside of a Hydra run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)
