"""The server-driven protocol as declared: every command named once, with its collectives and control fields."""
import numpy as np
import pytest

from hpcmtl import engine
from hpcmtl.dmtrl import DMTRLCommand, LocalBlocks
from hpcmtl.checkpoint import BlockState
from hpcmtl.engine import Control, Down, Up
from hpcmtl.joint_sparse import LocalGradients
from hpcmtl.online import LocalColumns

LOCALS = (LocalBlocks, LocalGradients, LocalColumns)


@pytest.mark.smoke
@pytest.mark.parametrize("local", LOCALS)
def test_every_command_has_a_computation_and_unique_id(local):
    ids = [int(c) for enum_ in local.COMMANDS for c in enum_]
    assert len(ids) == len(set(ids))
    for enum_ in local.COMMANDS:
        for cmd in enum_:
            assert callable(getattr(local, cmd.compute)), cmd
            assert isinstance(cmd.down, Down) and isinstance(cmd.up, Up)
            assert len(cmd.fields) <= engine.CONTROL_SIZE - 1
            if cmd.down in (Down.SCATTER_ROWS, Down.BCAST):
                assert "width" in cmd.fields, cmd          # the receiving ranks size their buffer from it
            if cmd.up_if is not None:
                assert cmd.up_if in cmd.fields


def test_control_fields_by_name():
    ctrl = Control(DMTRLCommand.APPLY, np.array([7, 1, 45, 0], dtype=np.int64))
    assert (ctrl.with_objective, ctrl.width) == (1, 45)
    with pytest.raises(AttributeError):
        ctrl.round


def test_block_state_pack_unpack_round_trip():
    a = BlockState(np.array([0.5, -1.0, 2.0]), np.array([2, 0, 1], dtype=np.int32), np.arange(5.0))
    b = BlockState(np.array([3.0]), np.array([0], dtype=np.int32), np.ones(5))
    data = BlockState.pack_all([a, b])
    assert data.shape == (2 * 3 + 5 + 2 * 1 + 5,)
    first, pos = BlockState.unpack(data, 0, 3)
    second, end = BlockState.unpack(data, pos, 1)
    assert end == data.size
    for saved, back in ((a, first), (b, second)):
        np.testing.assert_array_equal(saved.alpha, back.alpha)
        np.testing.assert_array_equal(saved.order, back.order)
        assert back.order.dtype == np.int32
        np.testing.assert_array_equal(saved.shrink, back.shrink)
    assert BlockState.pack_all([]).shape == (0,)
