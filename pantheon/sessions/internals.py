"""What Pantheon's other rooms use of the sessions package beyond its public face.

The re-run engine (``pantheon.rerun``) reads a recording at the level the recorder wrote
it: the codec of stored payloads, a request's digest, the effect statuses and the sink
effects are served through, the alignment of two runs' messages, and which recorded
message an approval came from. The read model reads a redrive's report by the words
its outcomes start with. A team's code never needs these: ``pantheon.sessions.__all__``
is its face, and tests/oncall refuses an import from an ``internals`` module.
"""

from pantheon.sessions._align import Lineage, Mapper, compare_runs, item_of, same_payload
from pantheon.sessions._approvals import origin_of
from pantheon.sessions._codec import decode, encode, normalize
from pantheon.sessions._digest import request_digest
from pantheon.sessions._effects import EffectSink, rebuild_error
from pantheon.sessions._redrive import DOWNSTREAM
from pantheon.sessions._store import EFFECT_DIVERGED, EFFECT_ERROR, EFFECT_OK, EFFECT_REPR, Status

__all__ = [
    "DOWNSTREAM",
    "EFFECT_DIVERGED",
    "EFFECT_ERROR",
    "EFFECT_OK",
    "EFFECT_REPR",
    "EffectSink",
    "Lineage",
    "Mapper",
    "Status",
    "compare_runs",
    "decode",
    "encode",
    "item_of",
    "normalize",
    "origin_of",
    "rebuild_error",
    "request_digest",
    "same_payload",
]
