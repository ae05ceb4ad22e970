"""Small metadata files: the current term and vote, written so a crash never tears them.

A node must not answer a vote before its term and vote are on disk: if it forgot
them in a crash it could vote twice in one term and let two leaders be elected.
DLedger keeps them in a Java-properties file named `currterm` (`currTerm=5`,
`voteLeader=n1`, an empty value for no vote) and overwrites it without an fsync;
we write the same text to `<path>.tmp`, fsync it, rename it over `<path>` and
fsync the directory, so a reader sees either the old or the new file, durably.
"""

from __future__ import annotations

from pathlib import Path

from raftmq.config.properties import format_properties, parse_properties
from raftmq.disk.filesystem import atomic_write

BEGIN_FILE = "begin"  # where a file store's log starts, when not at index 0 and pos 0
TERM_KEY = "currTerm"
VOTE_KEY = "voteLeader"
MEMBERS_KEY = "members"  # not DLedger's: the configuration in force (core.membership)
PRIOR_MEMBERS_KEY = "priorMembers"  # ... and the committed one before it


def begin_text(begin: tuple[int, int, int, int | None]) -> bytes:
    """The `begin` file of a log starting at (begin index, begin pos, term before it,
    chainCrc before it or None when unknown)."""
    begin_index, begin_pos, before_term, before_chain = begin
    return format_properties(
        {
            "beginIndex": str(begin_index),
            "beginPos": str(begin_pos),
            "beforeTerm": str(before_term),
            "beforeChainCrc": "" if before_chain is None else str(before_chain),
        }
    ).encode()


def parse_begin(text: str) -> tuple[int, int, int, int | None]:
    """What `begin_text` wrote: (begin index, begin pos, term before it, chainCrc before
    it or None); ValueError for a file that does not say it."""
    try:
        props = parse_properties(text)
        chain = props.get("beforeChainCrc", "")
        return (
            int(props["beginIndex"]),
            int(props["beginPos"]),
            int(props["beforeTerm"]),
            int(chain) if chain else None,
        )
    except KeyError as exc:
        raise ValueError(f"no {exc}") from None


def begin_after(base_dir: str | Path, begin_pos: int, seed_chain: int) -> None:
    """Make the file store under `base_dir`, which holds no log yet, begin with index 0
    at `begin_pos`, its first entry chained to `seed_chain` (an upgrade in place: the
    old CommitLog's end and digest; see `file`)."""
    base = Path(base_dir)
    assert not (base / "data").exists() or not any((base / "data").iterdir()), base
    base.mkdir(parents=True, exist_ok=True)
    atomic_write(base / BEGIN_FILE, begin_text((0, begin_pos, -1, seed_chain)))


class TermVoteFile:
    """The current term and the peer voted for in it, in DLedger's `currterm` file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # The configuration saved with the term and vote, as core.membership's
        # `MemberState.text` writes it: the one in force, a newline, the one before
        # (None: never changed, the member's dLegerPeers are in force); set by `load`.
        self.members_text: str | None = None

    def load(self) -> tuple[int, str | None]:
        """(term, vote); a node that never saved starts at term 0 with no vote, as DLedger does.

        A leftover `<path>.tmp` is a save that crashed before its rename, so it is
        ignored: the previous value is still the one in force.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0, None
        pairs = parse_properties(text)
        try:
            term = int(pairs.get(TERM_KEY, "0"))
        except ValueError:
            raise ValueError(f"{self.path}: {TERM_KEY} is not an integer") from None
        if term < 0:
            raise ValueError(f"{self.path}: negative {TERM_KEY} {term}")
        if MEMBERS_KEY in pairs:
            self.members_text = f"{pairs[MEMBERS_KEY]}\n{pairs.get(PRIOR_MEMBERS_KEY, '')}"
        return term, pairs.get(VOTE_KEY) or None

    def save(self, term: int, vote: str | None, members_text: str | None = None) -> None:
        """Save the term and vote, and the configuration when given (else the last saved)."""
        if term < 0:
            raise ValueError(f"negative term {term}")
        if members_text is not None:
            self.members_text = members_text
        pairs = {TERM_KEY: str(term), VOTE_KEY: vote or ""}
        if self.members_text is not None:
            pairs[MEMBERS_KEY], pairs[PRIOR_MEMBERS_KEY] = self.members_text.split("\n")
        atomic_write(self.path, format_properties(pairs).encode("utf-8"))


class MemoryTermVote:
    """TermVoteFile's interface without a disk, for the simulator: a crash keeps what was saved."""

    def __init__(self, term: int = 0, vote: str | None = None) -> None:
        self.term = term
        self.vote = vote
        self.members_text: str | None = None

    def load(self) -> tuple[int, str | None]:
        return self.term, self.vote

    def save(self, term: int, vote: str | None, members_text: str | None = None) -> None:
        if term < 0:
            raise ValueError(f"negative term {term}")
        self.term, self.vote = term, vote
        if members_text is not None:
            self.members_text = members_text


class Checkpoint:
    """DLedger 0.3.1.2's `checkpoint` file: the highest index this node holds durably *and*
    knows committed, so recovery can tell a torn tail (fine: never acknowledged) from
    lost committed data (refuse to start). Written every few seconds and at shutdown;
    a stale value only makes the check weaker, never wrong.
    """

    KEY = "committedIndex"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> int:
        try:
            pairs = parse_properties(self.path.read_text(encoding="utf-8"))
            return int(pairs.get(self.KEY, "-1"))
        except FileNotFoundError:
            return -1
        except ValueError:
            raise ValueError(f"{self.path}: {self.KEY} is not an integer") from None

    def save(self, index: int) -> None:
        atomic_write(self.path, format_properties({self.KEY: str(index)}).encode("utf-8"))
