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
