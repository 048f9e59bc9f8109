import pytest

from rag.documents.ids import (
    MAX_COLLECTION_LEN,
    MAX_DOCUMENT_ID_LEN,
    InvalidIdError,
    validate_collection,
    validate_document_id,
)


def test_limits_are_the_documented_ones():
    assert MAX_COLLECTION_LEN == 64
    assert MAX_DOCUMENT_ID_LEN == 128


def test_invalid_id_error_is_a_value_error():
    assert issubclass(InvalidIdError, ValueError)


@pytest.mark.parametrize("name", ["docs", "a", "A1", "my-docs", "my_docs", "v1.2", "0start", "x" * 64, "a.b-c_d"])
def test_valid_collection_names_are_returned_unchanged(name):
    assert validate_collection(name) == name


@pytest.mark.parametrize(
    "doc_id", ["doc1", "a", "9", "file.txt", "user@example.com", "urn:isbn:123", "a_b-c.d:e@f", "d" * 128]
)
def test_valid_document_ids_are_returned_unchanged(doc_id):
    assert validate_document_id(doc_id) == doc_id


@pytest.mark.parametrize("validate", [validate_collection, validate_document_id])
@pytest.mark.parametrize(
    "value",
    ["a/b", "/abs", "a\\b", "\\x", "a..b", "..", "../etc", "ab\x00c", "\x00"],
    ids=[
        "slash",
        "leading-slash",
        "backslash",
        "leading-backslash",
        "dotdot-inside",
        "dotdot",
        "traversal",
        "nul-inside",
        "nul",
    ],
)
def test_path_characters_are_rejected(validate, value):
    with pytest.raises(InvalidIdError, match="path characters"):
        validate(value)


@pytest.mark.parametrize("validate", [validate_collection, validate_document_id])
@pytest.mark.parametrize("value", ["", None, 5, 1.5, b"bytes", ["a"], {"a": 1}])
def test_empty_or_non_string_is_rejected(validate, value):
    with pytest.raises(InvalidIdError, match="non-empty string"):
        validate(value)


def test_over_length_collection_is_rejected_with_its_length():
    validate_collection("c" * 64)
    with pytest.raises(InvalidIdError, match=r"collection name is 65 characters long; the limit is 64"):
        validate_collection("c" * 65)


def test_over_length_document_id_is_rejected_with_its_length():
    validate_document_id("d" * 128)
    with pytest.raises(InvalidIdError, match=r"document id is 129 characters long; the limit is 128"):
        validate_document_id("d" * 129)


@pytest.mark.parametrize("validate", [validate_collection, validate_document_id])
@pytest.mark.parametrize("value", ["-lead", ".hidden", "_under", ":colon", "@at"])
def test_must_start_with_letter_or_digit(validate, value):
    with pytest.raises(InvalidIdError, match="starting with a letter or digit"):
        validate(value)


@pytest.mark.parametrize("validate", [validate_collection, validate_document_id])
@pytest.mark.parametrize(
    "value",
    [
        "has space",
        "trailing ",
        " leading",
        "tab\there",
        "new\nline",
        "semi;colon",
        "star*",
        "quote'",
        "ümlaut",
        "a%2Fb",
    ],
)
def test_disallowed_characters_are_rejected(validate, value):
    with pytest.raises(InvalidIdError, match="is invalid"):
        validate(value)


def test_colon_and_at_are_allowed_only_in_document_ids():
    assert validate_document_id("ns:doc@v2") == "ns:doc@v2"
    with pytest.raises(InvalidIdError, match="is invalid"):
        validate_collection("ns:coll")
    with pytest.raises(InvalidIdError, match="is invalid"):
        validate_collection("coll@v2")


def test_messages_name_the_kind_and_the_value():
    with pytest.raises(InvalidIdError) as excinfo:
        validate_collection("bad name")
    assert str(excinfo.value).startswith("collection name 'bad name' is invalid")
    assert "':'" not in str(excinfo.value)  # the collection hint does not advertise ':' / '@'

    with pytest.raises(InvalidIdError) as excinfo:
        validate_document_id("bad id")
    assert str(excinfo.value).startswith("document id 'bad id' is invalid")
    assert "':', '@'" in str(excinfo.value)

    with pytest.raises(InvalidIdError) as excinfo:
        validate_document_id("a/b")
    assert str(excinfo.value).startswith("document id 'a/b' contains path characters")


def test_long_bad_values_are_truncated_in_the_message():
    value = "x" * 50 + " y"  # 52 characters: under the limit but invalid
    with pytest.raises(InvalidIdError) as excinfo:
        validate_collection(value)
    assert repr("x" * 40) in str(excinfo.value)
    assert "y" not in str(excinfo.value).split(" is invalid")[0]
