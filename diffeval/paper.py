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
