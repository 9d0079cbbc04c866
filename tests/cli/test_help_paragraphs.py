"""Every command's help is its docstring with each paragraph on one line: Typer's rich mode prints a
docstring's single line breaks as they are, so source lines wrapped at 100 columns used to break
sentences in the middle of ``memfit --help``'s command list ("... on fake tensors and" / "show what
is live ...")."""

from __future__ import annotations

import inspect

from typer.testing import CliRunner

from memfit.cli import register_commands, unwrap_help


def test_each_paragraph_is_one_line():
    app = register_commands()
    for info in app.registered_commands:
        doc = inspect.cleandoc(info.callback.__doc__)
        assert info.help == unwrap_help(doc)
        paras = info.help.split("\n\n")
        assert len(paras) == len(doc.split("\n\n")), info.callback.__name__
        assert all("\n" not in p for p in paras), info.callback.__name__


def test_unwrap_keeps_paragraphs():
    assert unwrap_help("""One
        two.

        Three
        four.""") == "One two.\n\nThree four."


def test_the_command_list_reads_whole_sentences():
    out = CliRunner().invoke(register_commands(), ["--help"], env={"COLUMNS": "200"}).output
    assert any("on fake tensors and show what is live at the forward and backward peaks" in line
               for line in out.splitlines())
