"""Safe XML reading: paths and lines, malformed input, and refusal of DTDs and entities.

Every refusal must come out as a ConfigError (one problem with line and message) from the public
loader, never as an expat exception or a traceback, and never after expanding anything.
"""

import textwrap

import pytest

from config import ConfigError, load_config, load_config_text
from config.xmltree import MAX_DEPTH, XmlError, parse_xml


def test_paths_and_lines():
    root = parse_xml(
        textwrap.dedent(
            """\
            <R>
              <A>x</A>
              <B><C>1</C></B>
              <B>
                <C>2</C><C>3</C>
              </B>
            </R>
            """
        )
    )
    assert (root.path, root.line) == ("/R", 1)
    a, b1, b2 = root.children
    assert (a.path, a.line, a.text) == ("/R/A", 2, "x")
    assert (b1.path, b1.line) == ("/R/B[1]", 3)
    assert b1.children[0].path == "/R/B[1]/C"
    assert (b2.path, b2.line) == ("/R/B[2]", 4)
    assert [(c.path, c.line, c.text) for c in b2.children] == [
        ("/R/B[2]/C[1]", 5, "2"),
        ("/R/B[2]/C[2]", 5, "3"),
    ]


def test_text_comments_cdata_and_predefined_entities():
    root = parse_xml(
        '<?xml version="1.0"?><?some-pi data?><R><!-- note -->'
        "<F>/qty &gt; 1 AND /s = &apos;a&amp;b&apos; &#233;</F>"
        "<G><![CDATA[a < b && c]]></G></R>"
    )
    assert root.children[0].text == "/qty > 1 AND /s = 'a&b' \u00e9"
    assert root.children[1].text == "a < b && c"


def test_encoding_declaration_is_honoured():
    data = '<?xml version="1.0" encoding="ISO-8859-1"?><R><N>caf\u00e9</N></R>'.encode("latin-1")
    assert parse_xml(data).children[0].text == "caf\u00e9"


def test_utf8_bom():
    assert parse_xml(b"\xef\xbb\xbf<R><N>x</N></R>").children[0].text == "x"


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
  <!ENTITY lol "lol">
  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
  <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
  <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
  <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
  <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
  <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
  <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<TickertapeConfig><Name>&lol9;</Name></TickertapeConfig>
"""

XXE_FILE = """<?xml version="1.0"?>
<!DOCTYPE TickertapeConfig [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<TickertapeConfig><Name>&secret;</Name></TickertapeConfig>
"""

EXTERNAL_DTD = """<?xml version="1.0"?>
<!DOCTYPE TickertapeConfig SYSTEM "http://127.0.0.1:1/evil.dtd">
<TickertapeConfig><Name>tt</Name></TickertapeConfig>
"""

PARAMETER_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE TickertapeConfig [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]>
<TickertapeConfig><Name>tt</Name></TickertapeConfig>
"""

EMPTY_DOCTYPE = """<!DOCTYPE TickertapeConfig>
<TickertapeConfig><Name>tt</Name></TickertapeConfig>
"""


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (BILLION_LAUGHS, 2),
        (XXE_FILE, 2),
        (EXTERNAL_DTD, 2),
        (PARAMETER_ENTITY, 2),
        (EMPTY_DOCTYPE, 1),
    ],
    ids=["billion-laughs", "xxe-file", "external-dtd", "parameter-entity", "bare-doctype"],
)
def test_doctype_and_entities_are_refused(text, line):
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "evil.xml", env={})
    [problem] = info.value.problems
    assert problem.line == line
    assert "<!DOCTYPE> declaration is not allowed" in problem.message
    assert str(info.value).startswith(f"evil.xml:{line}: ")


def test_doctype_refused_as_bytes_too():
    with pytest.raises(XmlError, match="DOCTYPE"):
        parse_xml(BILLION_LAUGHS.encode())


def test_undefined_entity_is_an_error_not_a_lookup():
    text = "<TickertapeConfig>\n  <Name>&passwd;</Name>\n</TickertapeConfig>\n"
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "t.xml", env={})
    [problem] = info.value.problems
    assert problem.line == 2
    assert problem.path == "/TickertapeConfig/Name"
    assert "undefined entity" in problem.message and "&amp;" in problem.message


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("<TickertapeConfig>\n  <Name>tt</Nmae>\n</TickertapeConfig>", 2, 13, "mismatched tag"),
        ("<TickertapeConfig>\n  <Name>tt</Name>\n", 3, 1, "no element found"),
        ("", 1, 1, "the file is empty"),
        ("just text", 1, 1, "syntax error"),
        ("<TickertapeConfig><Name>a & b</Name></TickertapeConfig>", 1, 28, "bare & or <"),
        ("<A/><B/>", 1, 5, "junk after document element"),
        ("<TickertapeConfig>\n<!-- a -- b -->\n</TickertapeConfig>", 2, 10, "-- inside a comment"),
        ('<TickertapeConfig a="1" a="2"/>', 1, 25, "duplicate attribute"),
    ],
)
def test_malformed_xml_reports_line_and_column(text, line, column, words):
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "m.xml", env={})
    [problem] = info.value.problems
    assert problem.line == line
    assert f"(column {column})" in problem.message
    assert words in problem.message
    assert problem.message.startswith("malformed XML: ")


def test_malformed_xml_names_the_open_element():
    text = "<TickertapeConfig>\n  <SOW>\n    <Queue><Name>q</Name>\n  </SOW>\n</TickertapeConfig>"
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "m.xml", env={})
    [problem] = info.value.problems
    assert problem.path == "/TickertapeConfig/SOW/Queue"
    assert str(info.value) == (
        "m.xml:4: /TickertapeConfig/SOW/Queue: malformed XML: mismatched tag (column 5)"
    )


def test_nesting_is_bounded():
    deep = "<a>" * (MAX_DEPTH + 1) + "</a>" * (MAX_DEPTH + 1)
    with pytest.raises(XmlError, match=f"nested more than {MAX_DEPTH} deep"):
        parse_xml(deep)
    ok = "<a>" * MAX_DEPTH + "</a>" * MAX_DEPTH
    assert parse_xml(ok).tag == "a"


def test_binary_file_is_malformed_xml_not_a_crash(tmp_path):
    path = tmp_path / "journal.seg"
    path.write_bytes(b"TTJ1\x00\x01\x02\xff\xfe" * 100)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "malformed XML" in str(info.value)
