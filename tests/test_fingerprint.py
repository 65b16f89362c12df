from dwise_predict import ModelFingerprint


def test_mismatches_name_only_the_differing_critical_fields():
    a = ModelFingerprint(
        model_id="tiny-bd", block_size=32, threshold=0.95, mask_token_id=3, hidden_size=128
    )
    b = ModelFingerprint(
        model_id="tiny-bd",
        block_size=4,
        threshold=0.9,
        mask_token_id=3,
        hidden_size=None,
        dtype="bf16",
    )
    assert a.mismatches(b) == ["block_size", "threshold"]
    assert a.mismatches(a) == []


def test_round_trip_keeps_unknown_fields_in_extra():
    a = ModelFingerprint(model_id="m", block_size=32, threshold=0.95, revision="abc")
    d = a.to_dict() | {"future_field": 7}
    b = ModelFingerprint.from_dict(d)
    assert b.extra == {"future_field": 7}
    assert b.short() == "m@abc (block 32, low_confidence threshold 0.95)"
