"""Token lengths of a local training dataset: the input of dataset-aware planning (ftplan.planner.batching).

Reads JSONL, JSON, CSV, Parquet or a Hugging Face `save_to_disk` folder (Parquet and the folder need
pyarrow), takes a text field (or a chat `messages` list, whose contents are joined) or a pre-tokenized
ids field, and counts tokens with a local tokenizer (a folder holding tokenizer.json, or the file) through
the `tokenizers` library. Nothing is downloaded. Without a tokenizer the count is an estimate at
CHARS_PER_TOKEN characters per token, and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ftplan.core.errors import FtplanError

# English prose through a modern BPE vocabulary runs at about 4 characters per token (OpenAI's rule of
# thumb for its tokenizers; Llama-3's 128k vocabulary lands close to it). Code and other languages differ.
CHARS_PER_TOKEN = 4.0
TEXT_FIELDS = ("text", "content", "messages", "conversations", "prompt")
IDS_FIELDS = ("input_ids",)
TOKENIZE_BATCH = 1000


@dataclass(frozen=True)
class DatasetLengths:
    """Tokens per sample, and how they were counted (a tokenizer, stored ids, or an estimate)."""

    lengths: np.ndarray
    path: Path
    field: str
    method: str
    estimated: bool


def load_lengths(path: Path | str, text_field: str | None = None, ids_field: str | None = None,
                 tokenizer: Path | str | None = None, chars_per_token: float = CHARS_PER_TOKEN) -> DatasetLengths:
    """Token length of every sample of the dataset at path.

    With ids_field (or an `input_ids` column and no text_field) the stored ids are counted; otherwise the
    text field is tokenized with `tokenizer`, or estimated at chars_per_token without one.
    """
    path = Path(path)
    frame = read_table(path)
    if frame.empty:
        raise FtplanError(f"{path} holds no samples")
    if ids_field is None and text_field is None:
        ids_field = next((f for f in IDS_FIELDS if f in frame.columns), None)
        text_field = None if ids_field else next((f for f in TEXT_FIELDS if f in frame.columns), None)
        if ids_field is None and text_field is None:
            raise FtplanError(f"{path}: no text or input_ids column among {list(frame.columns)}; "
                              "name one with --text-field or --ids-field")
    field = ids_field or text_field
    if field not in frame.columns:
        raise FtplanError(f"{path}: no field '{field}'; the columns are {list(frame.columns)}")
    column = frame[field]
    if ids_field:
        lengths = np.asarray([_ids_length(v, field) for v in column], dtype=np.int64)
        return DatasetLengths(_nonempty(lengths, path), path, field, f"stored token ids ('{field}')", False)
    texts = [_as_text(v) for v in column]
    if tokenizer is not None:
        lengths = _tokenize(texts, Path(tokenizer))
        return DatasetLengths(_nonempty(lengths, path), path, field, f"tokenizer {tokenizer}", False)
    if chars_per_token <= 0:
        raise FtplanError(f"characters per token must be positive, got {chars_per_token}")
    lengths = np.asarray([max(1, math.ceil(len(t) / chars_per_token)) for t in texts], dtype=np.int64)
    return DatasetLengths(lengths, path, field,
                          f"ESTIMATE at {chars_per_token:g} characters per token (no --tokenizer given)", True)


def read_table(path: Path) -> pd.DataFrame:
    """The dataset's rows as a DataFrame, by file suffix, or a `save_to_disk` folder."""
    if not path.exists():
        raise FtplanError(f"dataset {path} does not exist")
    if path.is_dir():
        return _read_saved_dataset(path)
    suffix = "".join(path.suffixes[-2:]).lower() if path.suffix == ".gz" else path.suffix.lower()
    try:
        if suffix in (".jsonl", ".jsonl.gz", ".ndjson"):
            return pd.read_json(path, lines=True)
        if suffix in (".json", ".json.gz"):
            try:
                return pd.read_json(path, lines=True)
            except ValueError:
                return pd.read_json(path)
        if suffix in (".csv", ".csv.gz", ".tsv"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
        if suffix == ".parquet":
            _need_pyarrow("Parquet")
            return pd.read_parquet(path)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise FtplanError(f"cannot read {path}: {error}") from error
    raise FtplanError(f"{path}: unknown dataset format '{path.suffix}' (JSONL, JSON, CSV, Parquet, or a save_to_disk folder)")


def _read_saved_dataset(folder: Path) -> pd.DataFrame:
    """A Hugging Face `save_to_disk` folder: Arrow stream files listed in state.json; a DatasetDict's train split."""
    splits = folder / "dataset_dict.json"
    if splits.exists():
        names = json.loads(splits.read_text()).get("splits", [])
        split = "train" if "train" in names else (names[0] if names else None)
        if split is None:
            raise FtplanError(f"{folder}: dataset_dict.json names no split")
        return _read_saved_dataset(folder / split)
    state = folder / "state.json"
    files = ([folder / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
             if state.exists() else sorted(folder.glob("*.arrow")))
    if not files:
        raise FtplanError(f"{folder} is a folder but not a save_to_disk dataset (no state.json or .arrow files)")
    _need_pyarrow("a save_to_disk folder")
    import pyarrow as pa
    tables = []
    for file in files:
        with pa.memory_map(str(file)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables).to_pandas()


def _need_pyarrow(what: str) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError as error:
        raise FtplanError(f"reading {what} needs pyarrow (pip install pyarrow), or convert the data to JSONL") from error


def _tokenize(texts: list[str], tokenizer: Path) -> np.ndarray:
    """Lengths through the `tokenizers` library, special tokens included (as a training collator adds them)."""
    file = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    if not file.is_file():
        raise FtplanError(f"no tokenizer.json at {tokenizer} (give a local tokenizer folder or its tokenizer.json)")
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise FtplanError("--tokenizer needs the `tokenizers` library (pip install tokenizers)") from error
    try:
        model = Tokenizer.from_file(str(file))
    except Exception as error:  # the library raises its own exception types for a bad file
        raise FtplanError(f"cannot load tokenizer {file}: {error}") from error
    model.no_truncation()
    lengths: list[int] = []
    for start in range(0, len(texts), TOKENIZE_BATCH):
        lengths.extend(len(e.ids) for e in model.encode_batch(texts[start:start + TOKENIZE_BATCH]))
    return np.asarray(lengths, dtype=np.int64)


def _as_text(value: object) -> str:
    """A text cell, or a chat (a list of {role, content} turns) joined into one text."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        return "\n".join(_as_text(v.get("content", v.get("value", "")) if isinstance(v, dict) else v) for v in value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _ids_length(value: object, field: str) -> int:
    if isinstance(value, str):
        value = json.loads(value)  # ids written to CSV come back as their JSON text
    try:
        return len(value)
    except TypeError as error:
        raise FtplanError(f"field '{field}' holds {type(value).__name__}, not a list of token ids") from error


def _nonempty(lengths: np.ndarray, path: Path) -> np.ndarray:
    empty = int((lengths == 0).sum())
    if empty == len(lengths):
        raise FtplanError(f"{path}: every sample is empty")
    return lengths[lengths > 0]
