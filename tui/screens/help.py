"""Help: the workflow in five steps and the keys of each screen."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# headedit

Find attention heads whose zero-ablation improves a task, bake them out, validate, publish.
Heatmap colours: green = zeroing the head helps, red = it hurts, grey = no change (legend under the grid, points).

1. **Setup**: pick a recipe (`recipes/`) or fill the form; the model's layout shows as soon as it is named.
   `ctrl+o` goes to the recent runs (newest highlighted); `enter` reopens one at the step it reached.
2. **Discovery**: watch each stage and the layer×head heatmap fill in. `c` cancels (the run stays
   resumable), `r` resumes, `enter` goes on to the candidates.
3. **Candidates**: the search trace with the examples (`n`) each set was scored on; `s` sorts, `enter` takes
   the highlighted set, arrows + `space` on the heatmap edit a set by hand (or type it in the head-set box),
   `e` evaluates it, `a` goes back to the search's choice, `b` bakes.
4. **Bake & validate**: held-out accuracy of the reloaded checkpoint, intervals, paired test, side tasks.
   `p` continues to publishing.
5. **Publish**: repo id, private toggle, card preview; `ctrl+p` pushes. The local export is always kept.

| key | everywhere |
|---|---|
| `tab` / `shift+tab` | move between fields |
| `escape` | back one step: publish → validation → candidates → discovery → setup (also for a reopened run) |
| `?` / `f1` | this help |
| `ctrl+q` | quit (a running discovery stops at its next checkpoint and can be resumed) |
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
