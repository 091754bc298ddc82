"""The trace's references (fuse/recording/trace.py): typed, yet keyed as the tuples they are."""

from __future__ import annotations

import copy
import pickle

import pytest

from tpunb.fuse.recording.trace import Input, Node, Slot, reads

pytestmark = pytest.mark.unit


def test_refs_of_different_kinds_or_outputs_never_share_a_key():
    refs = [Input(0), Slot(0), Node(0), Node(0, 0), Node(0, 1), (0,), ("x", 0)]
    assert len(set(refs)) == len(refs)
    assert Node(3, 1) == ("n", 3, 1) and hash(Input(2)) == hash(("i", 2))  # a key hashes as tuples do
    assert repr(Slot(4)) == "('f', 4)"  # what the disk cache digests is unchanged


@pytest.mark.parametrize("ref", [Input(5), Slot(1), Node(7), Node(7, 2)], ids=repr)
def test_a_ref_copied_or_pickled_is_the_same_ref(ref):
    for again in (copy.copy(ref), copy.deepcopy(ref), pickle.loads(pickle.dumps(ref))):
        assert type(again) is type(ref) and again == ref


def test_reads_finds_a_ref_in_nested_arguments_and_only_that_kind():
    args = (Node(1), (Slot(0), Input(2)), 3)
    assert reads(args, Input(2)) and reads(args, Slot(0)) and reads(args, Node(1))
    assert not reads(args, Node(2)) and not reads(args, Input(0)) and not reads(args, Node(1, 0))
    assert Node(4, 1).op == 4 and Node(4, 1).out == 1 and Node(4).out is None and Input(9).index == 9
