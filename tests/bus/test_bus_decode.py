"""Every decoder of untrusted bytes in the bus fails the one way: a ``bus.DecodeError``
naming the input's size and a reason. Before, msgspec's RecursionError, UnicodeDecodeError
and OverflowError escaped the readers that caught only ``msgspec.DecodeError``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from untrusted_corpus import CORPUS

from bus import DecodeError, UntrustedDecoder
from bus.backends.nats import _wire as nats_wire
from bus.backends.zeromq import _wire as zmq_wire

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "any msgpack": UntrustedDecoder().decode,
    "any JSON": UntrustedDecoder(format="json").decode,
    "ZeroMQ control up": zmq_wire.control_up_decoder(zmq_wire.DEFAULT_MAX_FRAME).decode,
    "ZeroMQ control down": zmq_wire.control_down_decoder(zmq_wire.DEFAULT_MAX_FRAME).decode,
    "ZeroMQ link in": zmq_wire.link_in_decoder(zmq_wire.DEFAULT_MAX_FRAME).decode,
    "ZeroMQ link back": zmq_wire.link_back_decoder(zmq_wire.DEFAULT_MAX_FRAME).decode,
    "NATS wire": nats_wire.decode_wire,
    "NATS answer": nats_wire.decode_answer,
    "NATS directory entry": nats_wire.decode_node,
    "NATS sync ack": nats_wire.decode_sync,
    "JetStream reply": nats_wire.decode_json,
}


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("item", CORPUS)
def test_every_bus_decoder_turns_the_corpus_into_decode_errors(decoder: str, item: str) -> None:
    data = CORPUS[item]
    with pytest.raises(DecodeError) as caught:
        DECODERS[decoder](data)
    assert caught.value.size == len(data)
    assert caught.value.reason in ("malformed", "too_deep")
    assert f"of {len(data)} bytes is" in str(caught.value)


def test_deep_nesting_is_reported_as_too_deep() -> None:
    with pytest.raises(DecodeError) as caught:
        UntrustedDecoder().decode(CORPUS["msgpack nested 100,000 deep"])
    assert caught.value.reason == "too_deep"
    assert str(caught.value) == ("message of 100001 bytes is too deep: nested too deep to decode")


def test_a_string_that_is_not_utf8_names_the_error() -> None:
    with pytest.raises(DecodeError) as caught:
        UntrustedDecoder(format="json", what="gateway body").decode(b'"\xff"')
    assert str(caught.value) == (
        "gateway body of 3 bytes is malformed: UnicodeDecodeError: 'utf-8' codec can't "
        "decode byte 0xff in position 0: invalid start byte"
    )


def test_max_bytes_refuses_before_decoding() -> None:
    decode = UntrustedDecoder(max_bytes=4).decode
    assert decode(msgspec.msgpack.encode([1, 2])) == [1, 2]
    with pytest.raises(DecodeError) as caught:
        decode(msgspec.msgpack.encode("hello"))
    assert (caught.value.reason, caught.value.size) == ("too_large", 6)


def test_max_depth_bounds_what_the_interpreter_would_allow() -> None:
    decode = UntrustedDecoder(format="json", max_depth=100).decode
    assert decode(b"[" * 100 + b"]" * 100) is not None
    deep_dict = b'{"a":' * 101 + b"1" + b"}" * 101
    with pytest.raises(DecodeError) as caught:
        decode(deep_dict)
    assert (caught.value.reason, str(caught.value)) == (
        "too_deep",
        f"message of {len(deep_dict)} bytes is too deep: nested over 100 levels",
    )
    with pytest.raises(DecodeError):
        decode(b"[" * 101 + b"]" * 101)


def test_decode_error_is_a_bus_error_and_a_value_error() -> None:
    from bus import BusError

    assert issubclass(DecodeError, BusError) and issubclass(DecodeError, ValueError)


def test_a_struct_counts_as_one_level() -> None:
    class Box(msgspec.Struct, array_like=True):
        inner: Any

    decode = UntrustedDecoder(Box, max_depth=3).decode
    assert decode(msgspec.msgpack.encode(Box([[1]]))) == Box([[1]])
    with pytest.raises(DecodeError):
        decode(msgspec.msgpack.encode(Box([[[1]]])))


def test_a_nats_name_with_a_final_newline_is_refused() -> None:
    from bus.backends.nats._subjects import check_token

    assert check_token("team-1", "team") == "team-1"
    with pytest.raises(ValueError, match=r"team 'ops\\n' must be letters"):
        check_token("ops\n", "team")


def test_zeromq_decoders_take_the_link_s_own_frame_limit() -> None:
    """The size bound of a ZeroMQ decoder is its link's max_frame, whatever it is set to,
    not a default of the decoder's (a link set above it would refuse its own frames)."""
    frame = msgspec.msgpack.encode((5, 1, [(("t", "x" * 3000, 2, 1, None, 1, None, None, 0, 0,
                                              None), None, False)]))  # fmt: skip
    assert zmq_wire.link_in_decoder(4096).decode(frame).seq == 1
    with pytest.raises(DecodeError) as caught:
        zmq_wire.link_in_decoder(2048).decode(frame)
    assert caught.value.reason == "too_large"
