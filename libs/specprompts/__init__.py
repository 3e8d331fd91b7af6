"""specprompts: the real prompt sets specops measures and gates on.

`sources` reads the packaged data (ShareGPT, MT-Bench, HumanEval, MMLU) and builds the
`chat` and `code` sets; `structured` the structured-output tasks; `derived` the six
other fingerprints' sets; `sets` picks a workload's set and sizes it for a model;
`corpora` builds the default REST datastores; `examples` the heads' training data.
"""
