// A sandbox's lifecycle buttons, shared by the list and the sandbox's page.

import { call } from "../api";
import { h, listen } from "../dom";
import { STATES, type Sandbox, type State } from "../types";

export type Action = "pause" | "resume" | "stop" | "start" | "delete";

const labels: Record<Action, string> = {
  pause: "Pause",
  resume: "Resume",
  stop: "Stop",
  start: "Start",
  delete: "Delete",
};

// allowed is what a sandbox in state may be asked (openapi's summaries).
export function allowed(state: State): Action[] {
  switch (state) {
    case "running":
      return ["pause", "stop", "delete"];
    case "paused":
      return ["resume", "stop", "delete"];
    case "hibernated":
      return ["resume", "delete"];
    case "stopped":
      return ["start", "delete"];
    case "creating":
    case "lost":
      return ["delete"];
    default:
      return [];
  }
}

export function perform(id: string, action: Action): Promise<Sandbox> {
  const base = "/v1/sandboxes/" + encodeURIComponent(id);
  if (action === "delete") return call<Sandbox>("DELETE", base);
  return call<Sandbox>("POST", base + "/" + action);
}

export function sandboxHref(id: string): string {
  return "#/sandboxes/" + encodeURIComponent(id);
}

export function stateBadge(state: string): HTMLElement {
  const known = (STATES as readonly string[]).includes(state) ? state : "unknown";
  return h("span", { class: "badge state-" + known }, state);
}

export interface ActionUI {
  confirming: boolean; // Delete was clicked once: ask for the second click
  busy: boolean; // an action is under way
}

export interface ActionHandlers {
  run(action: Action): void;
  askDelete(): void;
  cancelDelete(): void;
}

// actionButtons renders the buttons a sandbox's state allows. Delete
// takes two clicks: Delete, then Confirm delete (or Cancel).
export function actionButtons(s: Sandbox, ui: ActionUI, on: ActionHandlers): HTMLElement {
  const box = h("div", { class: "actions", role: "group", "aria-label": "Actions" });
  for (const a of allowed(s.state)) {
    if (a === "delete" && ui.confirming) {
      box.append(
        listen(h("button", { type: "button", class: "danger", "data-action": "confirm-delete", disabled: ui.busy }, "Confirm delete"), "click", () => on.run("delete")),
        listen(h("button", { type: "button", "data-action": "cancel-delete", disabled: ui.busy }, "Cancel"), "click", () => on.cancelDelete()),
      );
      continue;
    }
    const b = h("button", { type: "button", "data-action": a, class: a === "delete" ? "danger-outline" : null, disabled: ui.busy }, labels[a]);
    listen(b, "click", () => (a === "delete" ? on.askDelete() : on.run(a)));
    box.append(b);
  }
  return box;
}
