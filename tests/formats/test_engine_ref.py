"""EngineRef: every form an engine is given in, parsed once, named as the reports name it."""

import pytest

from conformance.formats.engine_ref import CATALOG, COMMAND, MUTANT, PIN, EngineRef

RELEASES = ("0.27.1", "0.28.0", "0.33.0")


@pytest.mark.parametrize("text, kind, release, mutant, label", [
    ("0.28.0", PIN, "0.28.0", None, "vllm-0.28.0"),
    ("vllm==0.28.0", PIN, "0.28.0", None, "vllm-0.28.0"),
    ("vllm-0.33.0", PIN, "0.33.0", None, "vllm-0.33.0"),
    ("0.27.1+mutant:no-draft-reservation", MUTANT, "0.27.1", "no-draft-reservation",
     "vllm-0.27.1+mutant:no-draft-reservation"),
    ("0.27.1+mutant:catalog:ab12", CATALOG, "0.27.1", "ab12", "vllm-0.27.1+mutant:catalog:ab12"),
    ("./port --threads 2", COMMAND, None, None, "./port --threads 2"),
    ("/usr/bin/port", COMMAND, None, None, "port"),
])
def test_each_form_is_parsed_once(text, kind, release, mutant, label):
    ref = EngineRef.parse(text, RELEASES)
    assert (ref.kind, ref.release, ref.mutant, ref.label, ref.text) == (kind, release, mutant, label, text)
    assert ref.is_pin == (kind == PIN)


def test_a_command_line_is_split_never_run_by_a_shell():
    ref = EngineRef.parse("port --name 'a b' ; rm -rf x", RELEASES)
    assert ref.argv == ("port", "--name", "a b", ";", "rm", "-rf", "x")
    assert ref.command == "port --name 'a b' ';' rm -rf x" and ref.key == ref.command


def test_a_named_candidate_keeps_its_name_and_what_it_names():
    ref = EngineRef.parse("mine=./port --fast", RELEASES, named=True)
    assert (ref.name, ref.kind, ref.argv, ref.key) == ("mine", COMMAND, ("./port", "--fast"), "mine")
    pinned = EngineRef.parse("old=0.28.0", RELEASES, named=True)
    assert (pinned.name, pinned.kind, pinned.label, pinned.key) == ("old", PIN, "vllm-0.28.0", "old")
    # without names allowed, NAME=COMMAND is a command line; a pin's mutant is never a name
    assert EngineRef.parse("A=1 ./port", RELEASES).kind == COMMAND
    mutant = EngineRef.parse("0.27.1+mutant:x=y", RELEASES, named=True)
    assert (mutant.kind, mutant.mutant, mutant.name) == (MUTANT, "x=y", None)


def test_the_constructors_give_the_texts_a_user_would_type():
    assert EngineRef.test_device("0.27.1", "m") == EngineRef.parse("0.27.1+mutant:m", RELEASES)
    assert EngineRef.catalog_mutant("0.27.1", "c1") == EngineRef.parse("0.27.1+mutant:catalog:c1", RELEASES)
    assert EngineRef.pin("0.28.0") == EngineRef.parse("0.28.0", RELEASES)


@pytest.mark.parametrize("text, words", [
    ("", "empty engine command"),
    ("   ", "empty engine command"),
    ("port 'unclosed", "not a command line"),
    ("0.27.1+mutant:", "no mutant name"),
    ("0.27.1+mutant:catalog:", "no mutant id"),
])
def test_bad_input_names_the_text(text, words):
    with pytest.raises(ValueError) as err:
        EngineRef.parse(text, RELEASES)
    assert repr(text) in str(err.value) and words in str(err.value)


def test_a_release_that_is_not_pinned_is_not_a_pin():
    assert EngineRef.parse("vllm==0.20.0", RELEASES).kind == COMMAND  # prepare_engine then says so


def test_a_catalog_mutant_named_as_a_built_in_one_is_told_how_to_name_it():
    """`0.27.1+mutant:m08ee4ef403` (the catalog's id without `catalog:`) is refused with the
    name that works; another unknown name only lists the built-in mutants."""
    from engines.vllm import mutants

    with pytest.raises(ValueError) as caught:
        mutants.apply("m08ee4ef403")
    assert str(caught.value).endswith("(RELEASE+mutant:catalog:m08ee4ef403)")
    with pytest.raises(ValueError) as caught:
        mutants.apply("m08ee4ef40")
    assert "catalog" not in str(caught.value) and "no-draft-reservation" in str(caught.value)
