"""The paper's published figures that a run on another model is set beside (read off its LaTeX source).

Only what the source holds as numbers: its ΔSafety figure (SEPO - Base per game) is an image, so its
claim is quoted in words where a report needs it.
"""

from __future__ import annotations

#: exploit at Base, SFT and SEPO per game and model: the appendix table "SFT Degradation Across All Games"
SFT_DEGRADATION: dict[str, dict[str, tuple[float, float, float]]] = {
    "ipd": {"Gemma 4": (0.625, 0.625, 0.625), "Qwen 3.5": (5.000, 3.125, 1.250)},
    "auction": {"Gemma 4": (0.146, 0.000, 0.021), "Qwen 3.5": (0.042, 0.250, 0.125)},
    "neg_v1": {"Gemma 4": (0.000, 3.000, 2.000), "Qwen 3.5": (1.500, 2.000, 0.000)},
    "neg_v2": {"Gemma 4": (0.063, 6.031, 0.141), "Qwen 3.5": (0.781, 1.719, 2.031)},
    "kuhn": {"Gemma 4": (0.211, 0.000, 0.000), "Qwen 3.5": (0.705, 0.347, 0.000)},
}
