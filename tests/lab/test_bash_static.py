"""The static bash reader (lab/core/bash_static.py) against real bash: for each snippet, the words it
reads for the train command equal the words bash hands to a recording stand-in for `python3`
(bench/import_roundtrip.capture_train_argv, named as such there)."""
from __future__ import annotations

import pytest

from bench.import_roundtrip import capture_train_argv
from lab.core.bash_static import evaluate

SNIPPETS = {
    "defaults": 'A=${A:-x}\nB=${B-y}\nC=""\nD=${C:-z}\nE=${C-w}\nF=${NOPE:=q}\nG=${F:+set}\n'
                'python3 train.py --a "$A" --b "$B" --d "$D" --e "$E" --f "$F" --g "$G"\n',
    "arrays": "X=(a \"b c\" 'd')\nX+=(e)\nY=(\"${X[@]}\" f)\n"
              'python3 train.py --y "${Y[@]}" --n ${#Y[@]} --one "${X[1]}" --split ${X[@]} --star "${X[*]}"\n',
    "quotes": 'J="{\n  \\"k\\": \\"v\\\\\\\\\\",\n  \\"d\\": \\"\\$HOME\\"\n}"\nK=\'x\\y\'\nL=$\'a\\tb\'\n'
              'python3 train.py --j "$J" --k "$K" --l "$L" --m "a"\'b\'c\n',
    "continuations": "V=7\npython3 train.py \\\n  --x=${V} \\\n  --y \"${V}0\" \\\n  # not a comment of the command\n",
    "heredoc": "cat > /dev/null <<EOF\npython3 train.py --wrong 1\nEOF\ncat > /dev/null <<'EOF'\n$(not run)\nEOF\n"
               "python3 train.py --right 2\n",
    "seq and paths": "python3 train.py --bs $(seq 3) $(seq 2 2 6) --base $(basename /a/b/run.sh .sh) "
                     "--dir \"$(dirname /a/b/run.sh)\"\n",
    "export and append": "export P=1\nQ=a\nQ+=b\nexport R=\"$Q\"\npython3 train.py --p $P --r $R\n",
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_the_static_reader_reads_the_words_bash_passes(name, tmp_path):
    text = "#!/bin/bash\nset -e\n" + SNIPPETS[name]
    script = tmp_path / "run.sh"
    script.write_text(text)
    _, expected = capture_train_argv(script)
    ev = evaluate(text, lambda _: None, str(script))
    (cmd,) = [c for c in ev.commands if any(w.text == "train.py" for w in c.words)]  # a heredoc's text is no command
    words = [w.text for w in cmd.words]
    assert words[words.index("train.py") + 1:] == expected
