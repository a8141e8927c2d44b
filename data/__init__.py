"""
The data package: text into tokens, and tokens into batches.

    tokenizer.py         characters, GPT-2 BPE, or a BPE trained on your corpus
    sources.py           a corpus's documents: FORMATS, the table of file kinds
    corpus.py            documents into token shards, on every core
    text.py              one text into train.bin and val.bin
    tiny_shakespeare.py  the corpus of the README, found or downloaded
    shards.py            the shard files, written and read
    dataset.py           a prepared dataset folder: meta.json, its tokens; DATA_ROOT
    batches.py           training and evaluation batches from a split
    prepare.py           the command: python data/prepare.py SOURCE ...
"""
