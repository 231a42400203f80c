"""The DIFF paper's published numbers (Ye et al., ICLR 2025), for printing beside ours. Labelled as the paper's."""

# Table 3: attention scores on the answer span and on noise, by answer-needle depth (%), averaged over heads and layers;
# 3B models, 64K.
TABLE3 = {
    "paper: Transformer-3B": {
        "answer": {0: 0.03, 25: 0.03, 50: 0.03, 75: 0.07, 100: 0.09},
        "noise": {0: 0.51, 25: 0.54, 50: 0.52, 75: 0.49, 100: 0.49},
    },
    "paper: DIFF-3B": {
        "answer": {0: 0.27, 25: 0.30, 50: 0.31, 75: 0.32, 100: 0.40},
        "noise": {0: 0.01, 25: 0.02, 50: 0.02, 75: 0.02, 100: 0.01},
    },
}

# Table 2: multi-needle retrieval accuracy at 4K, N/R; 3B models trained at 4K.
TABLE2 = {
    "paper: Transformer-3B": {"1/1": 1.00, "2/2": 0.85, "4/2": 0.62, "6/2": 0.55},
    "paper: DIFF-3B": {"1/1": 1.00, "2/2": 0.92, "4/2": 0.84, "6/2": 0.85},
}

# Table 4: fraction of outputs judged hallucination-free by GPT-4o; 3B models at 4K, 100 samples per dataset.
TABLE4 = {
    "paper: Transformer-3B": {
        "xsum": 0.44,
        "cnndm": 0.32,
        "multi_news": 0.42,
        "qasper": 0.28,
        "hotpotqa": 0.36,
        "2wikimqa": 0.29,
    },
    "paper: DIFF-3B": {
        "xsum": 0.53,
        "cnndm": 0.41,
        "multi_news": 0.61,
        "qasper": 0.39,
        "hotpotqa": 0.46,
        "2wikimqa": 0.36,
    },
}

# Figure 7: TREC best - worst accuracy margin (points) over orders of the same demonstrations; 64K models.
FIGURE7_TREC = {
    "random": {"paper: Transformer-3B": 19.0, "paper: DIFF-3B": 4.0},
    "alternating": {"paper: Transformer-3B": 56.7, "paper: DIFF-3B": 13.4},
}

# Table 5: largest activation values over 0.4M tokens; 3B models.
TABLE5 = {
    ("paper: Transformer-3B", "attention logits"): {
        "top-1": 318.0,
        "top-2": 308.2,
        "top-3": 304.9,
        "top-10": 284.7,
        "top-100": 251.5,
        "median": 5.4,
    },
    ("paper: DIFF-3B", "attention logits"): {
        "top-1": 38.8,
        "top-2": 38.8,
        "top-3": 37.3,
        "top-10": 32.0,
        "top-100": 27.4,
        "median": 3.3,
    },
    ("paper: Transformer-3B", "hidden states"): {
        "top-1": 3608.6,
        "top-2": 3607.4,
        "top-3": 3603.6,
        "top-10": 3552.1,
        "top-100": 2448.2,
        "median": 0.6,
    },
    ("paper: DIFF-3B", "hidden states"): {
        "top-1": 1688.2,
        "top-2": 1672.5,
        "top-3": 1672.1,
        "top-10": 1624.3,
        "top-100": 740.9,
        "median": 1.2,
    },
}

# Table 1: zero-shot accuracy (LM Eval Harness), 3B models trained on 1T tokens.
TABLE1 = {
    "paper: OpenLLaMA-3B-v2": {
        "arc_challenge": 33.9,
        "arc_easy": 67.6,
        "boolq": 65.7,
        "hellaswag": 70.0,
        "openbookqa": 26.0,
        "piqa": 76.7,
        "winogrande": 62.9,
        "average": 57.5,
    },
    "paper: StableLM-base-alpha-3B-v2": {
        "arc_challenge": 32.4,
        "arc_easy": 67.3,
        "boolq": 64.6,
        "hellaswag": 68.6,
        "openbookqa": 26.4,
        "piqa": 76.0,
        "winogrande": 62.1,
        "average": 56.8,
    },
    "paper: DIFF-3B": {
        "arc_challenge": 37.8,
        "arc_easy": 72.9,
        "boolq": 69.0,
        "hellaswag": 71.4,
        "openbookqa": 29.0,
        "piqa": 76.8,
        "winogrande": 67.1,
        "average": 60.6,
    },
}


def coverage(name: str, has: list[str], lacks: list[str]) -> str:
    """One line for `report --paper`: which of the paper's settings behind `name` a run has, and which it lacks."""
    held = f"this run has {', '.join(has)}" if has else "this run has none of its settings"
    return f"The paper's {name}: {held}" + (f"; it lacks {', '.join(lacks)}" if lacks else "") + "."
