// The confirmation dialog: one `confirm_required` at a time, the others queued.
//
// The dialog takes the focus, so Enter confirms only once the person is looking
// at it (an Enter typed at the prompt never reaches it); Esc or Decline declines,
// which is a cancel of that command. The message is shown as the server wrote
// it, preformatted: a plan may be a table of many lines, scrolled inside the
// dialog when it is taller than the screen allows.

export class ConfirmDialog {
  /**
   * `ui`: the dialog's elements (dialog, line, message, yes, no); `answer(id, yes)`
   * acts on an answer; `stillAsking(id)` is true while that command still waits;
   * `prompt` gets the focus back.
   */
  constructor(ui, { answer, stillAsking, prompt }) {
    this.ui = ui;
    this.answer = answer;
    this.stillAsking = stillAsking;
    this.prompt = prompt;
    this.queue = []; // [{id, line, message}]
    this.asking = null; // the id on the screen
    ui.yes.addEventListener("click", () => this.decide(true));
    ui.no.addEventListener("click", () => this.decide(false));
    ui.dialog.addEventListener("cancel", (event) => {
      event.preventDefault(); // Esc: decline (and cancel), not just hide the question
      this.decide(false);
    });
    ui.dialog.addEventListener("keydown", (event) => {
      if (event.key !== "Enter" || event.repeat) return;
      // Enter on a focused button is that button's click; elsewhere in the dialog it confirms.
      if (event.target instanceof HTMLButtonElement) return;
      event.preventDefault();
      this.decide(true);
    });
  }

  get open() {
    return this.ui.dialog.open;
  }

  ask(id, line, message) {
    this.queue.push({ id, line, message });
    this.next();
  }

  /** Forget `id` (it ended or was cancelled); closes the dialog if it is the one asked. */
  drop(id) {
    this.queue = this.queue.filter((q) => q.id !== id);
    if (this.asking === id) this.close();
  }

  dropAll() {
    this.queue = [];
    this.close();
  }

  next() {
    if (this.asking !== null) return;
    while (this.queue.length) {
      const { id, line, message } = this.queue.shift();
      if (!this.stillAsking(id)) continue;
      this.asking = id;
      this.ui.line.textContent = line;
      this.ui.message.textContent = message;
      this.ui.message.scrollTop = 0;
      this.ui.dialog.showModal();
      this.ui.dialog.focus();
      return;
    }
  }

  decide(yes) {
    const id = this.asking;
    if (id === null) return;
    this.close();
    this.answer(id, yes);
  }

  close() {
    this.asking = null;
    if (this.ui.dialog.open) {
      this.ui.dialog.close();
      this.prompt.focus();
    }
    queueMicrotask(() => this.next());
  }
}
