"""Bible verse pairs: OSIS cleaning and record parsing (inline samples), and the real modules when installed."""

import shutil

import pytest

from lmforge.data.bible import TEST_BOOKS, clean_osis, parse_imp, write_pair_files

SAMPLE = """$$$[ Module Heading ]
$$$Genesis 0:0
<title level="1" type="main">Preface</title> words of a preface
$$$Genesis 1:0
<chapter n="1" osisID="Gen.1" sID="Gen.1"/>
$$$Genesis 1:1
<title type="section">The Creation</title><w lemma="strong:H7225">In the beginning</w> , God<note type="x">a note</note>
created.
$$$Genesis 1:2
<div sID="x"/>
"""


def test_clean_osis_drops_notes_titles_and_tags():
    raw = '<w lemma="a">EN el</w> <w>principio</w> ; fin <note n="1">nota</note>.'
    assert clean_osis(raw) == "EN el principio; fin."
    assert clean_osis("He said, “ <q>Go</q> ! ” ( now )") == "He said, “Go!” (now)"


def test_parse_imp_keeps_real_verses_only():
    verses = parse_imp(SAMPLE)
    assert verses == {("Genesis", 1, 1): "In the beginning, God created."}  # headings and empty verses dropped


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mod2imp") is None,
                    reason="needs Debian's sword-text-web sword-text-sparv libsword-utils (apt-get install)")
def test_real_pairs_hold_out_whole_books(tmp_path):
    paths = write_pair_files(tmp_path)
    train = paths["train"].read_text(encoding="utf-8").splitlines()
    test = paths["test"].read_text(encoding="utf-8").splitlines()
    assert len(train) + len(test) == 30_458  # of the 31,077 verses in both: aligned chapters, plausible lengths
    assert not any(line.startswith("Yahweh spoke to Moses, saying,\tY DESPUÉS") for line in train)  # Num 12:16
    assert all(line.count("\t") == 1 for line in train + test)
    assert train[0] == ("In the beginning, God created the heavens and the earth.\t"
                        "EN el principio crió Dios los cielos y la tierra.")
    assert 300 < len(test) < 400 and len(TEST_BOOKS) == 4
    assert max(len(line) for line in train) < 1200  # Revelation 22:21 without the WEB's glossary
    assert not any("<" in line or ">" in line for line in train)
