// Two-click confirmation for what cannot be undone (never a confirm()
// dialog): the first click shows "Confirm …" and "Cancel" in place of the
// button; the second does it. data-action names the three buttons ACTION,
// confirm-ACTION and cancel-ACTION.

import { h, listen } from "../dom";

export interface ConfirmSpec {
  action: string; // e.g. "delete"
  label: string; // e.g. "Delete"
  confirmLabel: string; // e.g. "Confirm delete"
  confirming: boolean;
  busy: boolean;
  onAsk(): void;
  onConfirm(): void;
  onCancel(): void;
}

export function confirmButtons(spec: ConfirmSpec): HTMLButtonElement[] {
  if (spec.confirming) {
    return [
      listen(h("button", { type: "button", class: "danger", "data-action": "confirm-" + spec.action, disabled: spec.busy }, spec.confirmLabel), "click", () => spec.onConfirm()),
      listen(h("button", { type: "button", "data-action": "cancel-" + spec.action, disabled: spec.busy }, "Cancel"), "click", () => spec.onCancel()),
    ];
  }
  return [listen(h("button", { type: "button", class: "danger-outline", "data-action": spec.action, disabled: spec.busy }, spec.label), "click", () => spec.onAsk())];
}

// focusAction focuses the button data-action=action in the row of body
// whose data-id is id (compared as a string, never put in a selector).
export function focusAction(body: HTMLElement, id: string, action: string): void {
  for (const tr of Array.from(body.querySelectorAll("tr"))) {
    if (tr.getAttribute("data-id") === id) tr.querySelector<HTMLElement>(`[data-action="${CSS.escape(action)}"]`)?.focus();
  }
}
