"""A grid's axes as a reproduction runs them: an axis's short name (the last part of its key, which
names run folders) and the axes cut to the values `reproduce --axis KEY=V1,V2` names."""
from __future__ import annotations

from lengthgen.errors import UserError
from lengthgen.results.rows import cell


def axis_name(key: str) -> str:
    return key.rsplit(".", 1)[-1]  # task.options.k_train -> k_train


def cut_axes(at, tasks: list[str], axes: dict | None) -> dict[str, dict]:
    """{task: its axes}, each axis named in `axes` ({key: [values as written]}, --axis) cut to those of
    its values; a key no chosen task has, or a value the grid does not declare, is a UserError (values
    --axis adds to a grid join it first: AtScale.with_values)."""
    whole = {task: at.axes(task) for task in tasks}
    for key, values in (axes or {}).items():
        declared = {cell(v) for task_axes in whole.values() for v in task_axes.get(key, [])}
        if not declared:
            named = sorted({k for task_axes in whole.values() for k in task_axes})
            raise UserError(f"--axis {key}: no axis of the tasks chosen; their axes: {', '.join(named) or 'none'}")
        unknown = [v for v in values if v not in declared]
        if unknown or not values:
            raise UserError(f"--axis {key}={','.join(values)}: {unknown[0] if unknown else 'no value'} is not one of "
                            f"its values ({', '.join(sorted(declared))})")
    return {task: {key: [v for v in vs if key not in (axes or {}) or cell(v) in axes[key]] for key, vs in task_axes.items()}
            for task, task_axes in whole.items()}

