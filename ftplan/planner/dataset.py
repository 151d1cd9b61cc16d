"""Token lengths of a local training dataset: the input of dataset-aware planning (ftplan.models.batching).

Reads JSONL, JSON, CSV, Parquet or a Hugging Face `save_to_disk` folder (Parquet and the folder need
pyarrow), takes a text field (or TRL's prompt + completion, or a chat `messages` list, whose contents are
joined) or a pre-tokenized ids field, and counts tokens with a local tokenizer (a folder holding
tokenizer.json, or the file) through the `tokenizers` library. Nothing is downloaded. Without a tokenizer the count is an estimate at
CHARS_PER_TOKEN characters per token, and says so.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ftplan.core.errors import FtplanError
from ftplan.store import lengths_cache

if TYPE_CHECKING:  # pandas loads when a dataset is read: a plan without one never needs it
    import pandas as pd

# English prose through a modern BPE vocabulary runs at about 4 characters per token (OpenAI's rule of
# thumb for its tokenizers; Llama-3's 128k vocabulary lands close to it). Code and other languages differ.
CHARS_PER_TOKEN = 4.0
CHARS_PER_TOKEN_RANGE = (0.1, 100.0)  # one byte-level token per byte (0.25-1 for CJK) to whole words: 1e-9 planned
# samples of a trillion tokens
# In order of preference; TRL's prompt-completion format trains on both, so both are counted.
TEXT_FIELDS = (("text",), ("content",), ("prompt", "completion"), ("messages",), ("conversations",), ("prompt",))
IDS_FIELDS = ("input_ids",)
TOKENIZE_BATCH = 1000
MAX_DATASET_BYTES = 2**30  # read at most this much text: lengths of more would not fit in bounded memory
# Rows held at once: each costs a dict and its strings, so 14 million short JSON lines (322 MB) took 5.5 GB.
MAX_DATASET_ROWS = 2_000_000
# One JSON document is parsed whole, every row at once: at most this much (a 322 MB one took 4.3 GB).
MAX_JSON_DOCUMENT_BYTES = 64 * 2**20
CHAT_TURN_KEYS = {"role", "from"}  # a turn of a chat (OpenAI / ShareGPT style), not a row of a dataset
BAD_LINE_WARNINGS = 20  # bad JSONL lines named one by one; the rest counted in one line
MAX_CHAT_DEPTH = 3  # messages -> turn -> content parts; deeper nesting is not a chat


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
    text field (the first of TEXT_FIELDS the data holds) is tokenized with `tokenizer`, or estimated at
    chars_per_token without one. The method says which fields were counted, as the plan prints it.
    Counted once per content: a file read without a warning has its lengths cached under the digest of
    its bytes, the tokenizer's and these options, so planning it again skips reading and tokenizing.
    """
    path = Path(path)
    key = _lengths_key(path, text_field, ids_field, tokenizer, chars_per_token)
    cached = lengths_cache.load(key) if key else None
    if cached is not None:
        return DatasetLengths(np.asarray(cached["lengths"], dtype=np.int64), path, cached["field"],
                              cached["method"], cached["estimated"])
    with _replayed_warnings() as caught:
        read = _count_lengths(path, text_field, ids_field, tokenizer, chars_per_token)
    if key and not caught:  # a file that warned is read again next time, and warns again
        lengths_cache.store(key, {"lengths": read.lengths.tolist(), "field": read.field, "method": read.method,
                                  "estimated": read.estimated})
    return read


@contextmanager
def _replayed_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """The warnings raised inside, collected, then shown on the way out (after an error too) as they would have been."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _lengths_key(path: Path, text_field: str | None, ids_field: str | None, tokenizer: Path | str | None,
                 chars_per_token: float) -> str | None:
    """Digest of what the lengths depend on (the tokenizers library's version too: it does the counting); None
    (not cached) unless the data and the tokenizer are regular files of a size ftplan reads and the library is
    installed, so a folder, a FIFO or a file to refuse takes the ordinary path and its error."""
    files = [path] if tokenizer is None else [path, _tokenizer_file(Path(tokenizer))]
    try:
        library = None if tokenizer is None else _tokenizers_version()
        if not all(f.is_file() for f in files) or path.stat().st_size > MAX_DATASET_BYTES:
            return None
        digests = [lengths_cache.file_digest(f) for f in files]
    except (OSError, ImportError):
        return None
    code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return json.dumps([digests, text_field, ids_field, None if tokenizer is None else str(tokenizer), library,
                       chars_per_token, code])


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


def _count_lengths(path: Path, text_field: str | None, ids_field: str | None, tokenizer: Path | str | None,
                   chars_per_token: float) -> DatasetLengths:
    frame = read_table(path)
    if frame.empty:
        raise FtplanError(f"{path} holds no samples")
    if ids_field is None and text_field is None:
        ids_field = next((f for f in IDS_FIELDS if f in frame.columns), None)
    if ids_field:
        column = _column(frame, ids_field, path)
        lengths = np.asarray([_ids_length(v, ids_field, path, row, frame.attrs.get("lines")) for row, v in enumerate(column)], dtype=np.int64)
        return DatasetLengths(_nonempty(lengths, path), path, ids_field, f"stored token ids ('{ids_field}')", False)
    fields = (text_field,) if text_field else _text_fields(frame.columns, path)
    texts = _texts(frame, fields, path)
    used = " + ".join(f"'{f}'" for f in fields)
    if any(isinstance(v, (list, tuple, np.ndarray)) for v in frame[fields[0]]):
        used += "; message contents only, the chat template's tokens are not counted"
    if tokenizer is not None:
        lengths = _tokenize(texts, Path(tokenizer))
        return DatasetLengths(_nonempty(lengths, path), path, " + ".join(fields),
                              f"tokenizer {tokenizer}, of {used}", False)
    low, high = CHARS_PER_TOKEN_RANGE
    if not low <= chars_per_token <= high:  # NaN: a ValueError; inf: every sample empty
        raise FtplanError(f"characters per token must be a positive number from {low:g} to {high:g}, "
                          f"got {chars_per_token}")
    lengths = np.asarray([math.ceil(len(t) / chars_per_token) for t in texts], dtype=np.int64)
    return DatasetLengths(_nonempty(lengths, path), path, " + ".join(fields),
                          f"ESTIMATE at {chars_per_token:g} characters per token (no --tokenizer given), of {used}",
                          True)


def _text_fields(columns: pd.Index, path: Path) -> tuple[str, ...]:
    """The first of TEXT_FIELDS the dataset holds all of."""
    for fields in TEXT_FIELDS:
        if all(f in columns for f in fields):
            return fields
    raise FtplanError(f"{path}: no text or input_ids column among {list(columns)}; "
                      "name one with --text-field or --ids-field")


def _column(frame: pd.DataFrame, field: str, path: Path) -> pd.Series:
    if field not in frame.columns:
        raise FtplanError(f"{path}: no field '{field}'; the columns are {list(frame.columns)}")
    return frame[field]


def _texts(frame: pd.DataFrame, fields: tuple[str, ...], path: Path) -> list[str]:
    """Each row's fields joined; a row missing one (absent, null, not text) is an error, since counting it
    as one token undercounts the plan by whatever the row really holds."""
    columns = [_column(frame, f, path) for f in fields]
    texts, missing = [], []
    for row, values in enumerate(zip(*columns)):
        if all(_is_text(v) for v in values):
            texts.append("".join(_as_text(v) for v in values))
        else:
            missing.append(row)
    if missing:
        raise FtplanError(f"{path}: {len(missing):,} of {len(frame):,} rows have no text in "
                          f"{' or '.join(repr(f) for f in fields)} (absent, null or not a string), e.g. "
                          f"{_where(frame.attrs.get('lines'), missing[0])}; fix or drop them, or name the field with --text-field")
    return texts


def _is_text(value: object) -> bool:
    """A string, or a chat: a list of turns ({role, content} dicts) or of text parts; a list of numbers is not."""
    if isinstance(value, str):
        return True
    return isinstance(value, (list, tuple, np.ndarray)) and all(isinstance(v, (str, dict)) for v in value)


def _where(lines: list[int] | None, row: int) -> str:
    """Where a row sits in the file: its line in JSONL (blank and bad lines are skipped), else its number."""
    return f"line {lines[row]}" if lines else f"row {row + 1}"


def read_table(path: Path) -> pd.DataFrame:
    """The dataset's rows as a DataFrame, by file suffix, or a `save_to_disk` folder."""
    import pandas as pd

    if not path.exists():
        raise FtplanError(f"dataset {path} does not exist")
    if path.is_dir():
        return _read_saved_dataset(path)
    if not path.is_file():  # a FIFO would wait for a writer, /dev/zero never ends
        raise FtplanError(f"dataset {path} is not a regular file")
    suffix = "".join(path.suffixes[-2:]).lower() if path.suffix == ".gz" else path.suffix.lower()
    if suffix not in (".jsonl", ".jsonl.gz", ".ndjson") and path.stat().st_size > MAX_DATASET_BYTES:
        raise FtplanError(f"dataset {path} is over {MAX_DATASET_BYTES // 2**30} GiB; plan from a JSONL file or a sample")
    try:
        if suffix in (".jsonl", ".jsonl.gz", ".ndjson"):
            return _read_jsonl(path)
        if suffix in (".json", ".json.gz"):
            return _read_json(path)
        if suffix in (".csv", ".csv.gz", ".tsv"):
            # an empty cell is empty text, and 'NA' or 'null' are words, not missing values
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", keep_default_na=False)
        if suffix == ".parquet":
            _need_pyarrow("Parquet")
            return pd.read_parquet(path)
    except (OSError, ValueError) as error:  # ValueError: pandas' parser errors, and bytes that are not UTF-8
        raise FtplanError(f"cannot read {path}: {error}") from error
    raise FtplanError(f"{path}: unknown dataset format '{path.suffix}' (JSONL, JSON, CSV, Parquet, or a save_to_disk folder)")


def _read_json(path: Path) -> pd.DataFrame:
    """A .json file: one document (a list of rows, columns of equal length, one row, or one key holding the rows,
    as `json.dump` writes them on one line) or, when it holds several, JSON Lines. pandas' JSON Lines reader
    took a one-line list for 400 columns of one row, and a one-line column object for one sample."""
    import pandas as pd

    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as stream:
        text = stream.read(MAX_JSON_DOCUMENT_BYTES + 1)
    if len(text) > MAX_JSON_DOCUMENT_BYTES:
        if text.lstrip()[:1] == b"{" and b"\n{" in text:  # one object a line, under a .json name
            return _read_jsonl(path)
        raise FtplanError(f"{path}: over {MAX_JSON_DOCUMENT_BYTES // 2**20} MiB of one JSON document, which is parsed "
                          "whole; write it as JSON Lines (.jsonl, one row a line), which is read a line at a time")
    try:
        document = json.loads(text)
    except RecursionError:
        raise FtplanError(f"{path}: JSON nested too deeply") from None
    except ValueError:
        return _read_jsonl(path)  # several documents, one a line
    only = next(iter(document.values())) if isinstance(document, dict) and len(document) == 1 else None
    if isinstance(only, list) and only and all(isinstance(row, dict) for row in only) and not _is_chat(only):
        document = only  # {"data": [rows]} or {"train": [rows]}; {"messages": [turns]} is one chat
    if isinstance(document, list):
        if len(document) > MAX_DATASET_ROWS:
            raise _too_many_rows(path)
        if not all(isinstance(row, dict) for row in document):
            raise FtplanError(f"{path}: a JSON list whose items are not all objects (rows)")
        return pd.DataFrame(document)
    if isinstance(document, dict):
        columns = [len(v) for v in document.values() if isinstance(v, list)]
        if not columns or any(_is_chat(v) for v in document.values()):
            return pd.DataFrame([document])  # one row, or one chat
        if len(columns) == len(document) and len(set(columns)) == 1:
            return pd.DataFrame(document)
    raise FtplanError(f"{path}: JSON neither rows (a list of objects) nor columns (lists of one length)")


def _too_many_rows(path: Path) -> FtplanError:
    return FtplanError(f"{path}: over {MAX_DATASET_ROWS:,} rows; plan from a random sample of them (their lengths are "
                       f"what matters), e.g. shuf -n {MAX_DATASET_ROWS} {path.name}")


def _is_chat(value: object) -> bool:
    """A list of chat turns (each a dict with a role), which is one sample's messages, not rows of a dataset."""
    return isinstance(value, list) and bool(value) and all(isinstance(t, dict) and CHAT_TURN_KEYS & t.keys() for t in value)


def _read_jsonl(path: Path) -> pd.DataFrame:
    """JSON Lines read a line at a time (gzip as it decompresses): a bad line is skipped with a warning naming its line, up to BAD_LINE_WARNINGS of them, and the
    text read is bounded (a 1.5 MB gzip once decompressed into 4.7 GB of memory)."""
    import pandas as pd

    rows, lines, bad, read = [], [], 0, 0
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as stream:
        for number, line in enumerate(stream, 1):
            read += len(line)
            if read > MAX_DATASET_BYTES:
                raise FtplanError(f"{path}: over {MAX_DATASET_BYTES // 2**30} GiB of JSON lines; plan from a sample "
                                  f"(e.g. the first million lines: head -n 1000000)")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                problem = None if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"
            except RecursionError:
                problem = "JSON nested too deeply"
            except UnicodeDecodeError:  # whole, but saved as latin-1 or UTF-16: JSON Lines are UTF-8
                problem = "not UTF-8 text (save the file as UTF-8)"
            except ValueError:
                problem = "not JSON (a torn or corrupt line)"
            if problem:
                bad += 1
                if bad <= BAD_LINE_WARNINGS:
                    warnings.warn(f"{path}:{number}: {problem}; line skipped", UserWarning, stacklevel=4)
                continue
            if len(rows) >= MAX_DATASET_ROWS:
                raise _too_many_rows(path)
            rows.append(row)
            lines.append(number)
    if bad > BAD_LINE_WARNINGS:
        warnings.warn(f"{path}: ... and {bad - BAD_LINE_WARNINGS:,} more bad lines skipped", UserWarning, stacklevel=4)
    frame = pd.DataFrame.from_records(rows)
    frame.attrs["lines"] = lines  # each row's line in the file, for errors
    return frame


def _read_saved_dataset(folder: Path) -> pd.DataFrame:
    """A Hugging Face `save_to_disk` folder: Arrow stream files listed in state.json; a DatasetDict's train split."""
    splits = folder / "dataset_dict.json"
    if splits.exists():
        names = _json_object(splits).get("splits", [])
        if not isinstance(names, list) or not all(isinstance(n, str) and n and n not in (".", "..") and "/" not in n
                                                  and "\\" not in n for n in names):
            raise FtplanError(f"{splits}: 'splits' must be a list of split folder names")
        split = "train" if "train" in names else (names[0] if names else None)
        if split is None:
            raise FtplanError(f"{folder}: dataset_dict.json names no split")
        if (folder / split / "dataset_dict.json").exists():
            raise FtplanError(f"{folder / split}: a split holds another dataset_dict.json; give the split's folder")
        return _read_saved_dataset(folder / split)
    state = folder / "state.json"
    try:
        files = ([folder / f["filename"] for f in _json_object(state).get("_data_files", [])]
                 if state.exists() else sorted(folder.glob("*.arrow")))
    except (KeyError, TypeError) as error:
        raise FtplanError(f"{state}: a data file entry lacks its filename") from error
    if not files:
        raise FtplanError(f"{folder} is a folder but not a save_to_disk dataset (no state.json or .arrow files)")
    _need_pyarrow("a save_to_disk folder")
    import pyarrow as pa
    tables = []
    for file in files:
        try:
            with pa.memory_map(str(file)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except (OSError, pa.ArrowException) as error:
            raise FtplanError(f"cannot read {file}: {error}") from error
    return pa.concat_tables(tables).to_pandas()


def _json_object(path: Path) -> dict:
    """A save_to_disk folder's JSON index file, or a one-line error for a corrupt one."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as error:  # ValueError: not JSON or not UTF-8
        raise FtplanError(f"cannot read {path}: {error}") from error
    if not isinstance(data, dict):
        raise FtplanError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def _need_pyarrow(what: str) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError as error:
        raise FtplanError(f"reading {what} needs pyarrow (pip install 'ftplan[dataset]'), or convert the data to JSONL") from error


def _tokenizer_file(tokenizer: Path) -> Path:
    """The tokenizer.json a --tokenizer names: the file itself, or the one in its folder."""
    return tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer


def _tokenize(texts: list[str], tokenizer: Path) -> np.ndarray:
    """Lengths through the `tokenizers` library, special tokens included (as a training collator adds them)."""
    file = _tokenizer_file(tokenizer)
    if not file.is_file():
        raise FtplanError(f"no tokenizer.json at {tokenizer} (give a local tokenizer folder or its tokenizer.json)")
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise FtplanError("--tokenizer needs the `tokenizers` library (pip install 'ftplan[dataset]')") from error
    try:
        model = Tokenizer.from_file(str(file))
    except Exception as error:  # the library raises its own exception types for a bad file
        raise FtplanError(f"cannot load tokenizer {file}: {error}") from error
    model.no_truncation()
    encode = getattr(model, "encode_batch_fast", model.encode_batch)  # tokenizers >= 0.20: the same ids, no offsets
    lengths: list[int] = []
    for start in range(0, len(texts), TOKENIZE_BATCH):
        lengths.extend(len(e.ids) for e in encode(texts[start:start + TOKENIZE_BATCH]))
    return np.asarray(lengths, dtype=np.int64)


def _as_text(value: object, depth: int = 0) -> str:
    """A text cell, or a chat (a list of {role, content} turns) joined into one text."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, np.ndarray)) and depth < MAX_CHAT_DEPTH:
        texts = (_as_text(_turn_text(v), depth + 1) + _tool_calls_text(v) if isinstance(v, dict) else
                 _as_text(v, depth + 1) for v in value)
        return "\n".join(text for text in texts if text)  # an image part or an empty turn adds no newline
    if isinstance(value, (list, tuple, np.ndarray, dict)):  # nested deeper than any chat: its JSON text is counted
        try:
            return json.dumps(value, default=str)
        except (RecursionError, ValueError):
            return ""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _turn_text(turn: dict) -> object:
    """A turn's or content part's text: `content` (OpenAI, TRL), `value` (ShareGPT) or `text` (a part
    {"type": "text", "text": ...} of a content list); an image part has none."""
    for key in ("content", "value", "text"):
        if key in turn:
            return turn[key]
    return ""


def _tool_calls_text(turn: dict) -> str:
    """The tool calls of an assistant turn as a chat template renders them (each call's JSON: name and
    arguments), which its content leaves out: 800 characters of arguments were counted as 2 tokens."""
    calls = turn.get("tool_calls")
    if not isinstance(calls, (list, tuple, np.ndarray)) or not len(calls):  # Parquet's lists come as arrays
        return ""
    try:
        return "\n" + "\n".join(json.dumps(call.get("function", call) if isinstance(call, dict) else call,
                                             default=str) for call in calls)
    except (RecursionError, ValueError):
        return ""


def _ids_length(value: object, field: str, path: Path, row: int, lines: list[int] | None) -> int:
    if isinstance(value, str):
        try:
            value = json.loads(value)  # ids written to CSV come back as their JSON text
        except (ValueError, RecursionError):
            pass
    if not _token_ids(value):  # a nested list's outer length is not its token count
        raise FtplanError(f"{path}: field '{field}' holds {type(value).__name__} {_clip(value)} at "
                          f"{_where(lines, row)}, not a list of token ids")
    return len(value)


def _token_ids(value: object) -> bool:
    """A flat sequence of integers, judged by its dtype or first element (every id checked would cost a Python
    loop over the whole dataset's tokens)."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.ndim == 1 and value.dtype.kind in "iu"
    if not isinstance(value, (list, tuple, np.ndarray)):
        return False
    return len(value) == 0 or (isinstance(value[0], (int, np.integer)) and not isinstance(value[0], bool))


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _nonempty(lengths: np.ndarray, path: Path) -> np.ndarray:
    """Samples of zero tokens, left out: they add no tokens and a collator has nothing to batch."""
    empty = int((lengths == 0).sum())
    if empty == len(lengths):
        raise FtplanError(f"{path}: every sample is empty")
    if empty:
        warnings.warn(f"{path}: {empty:,} of {len(lengths):,} samples are empty (0 tokens) and are left out",
                      UserWarning, stacklevel=3)
    return lengths[lengths > 0]
