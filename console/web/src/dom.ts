// A tiny DOM builder. Everything the console shows is built with it:
// strings always become text nodes, attributes are set one by one with
// setAttribute, and no markup is ever parsed from a string. Event
// handlers are attached in code with addEventListener (listen below),
// never as on* attributes.

export type Child = Node | string | number | null | undefined | false | Child[];
export type AttrValue = string | number | boolean | null | undefined;
export type Attrs = Record<string, AttrValue>;

// Attributes that take a URL: only same-origin paths and hash routes.
const urlAttrs = new Set(["href", "src", "action", "formaction", "xlink:href"]);

// safeURL accepts "/path..." (not "//host" nor "/\host") and "#route".
export function safeURL(u: string): string {
  if (/^#/.test(u) || /^\/(?![/\\])/.test(u)) return u;
  throw new Error("refusing a URL that is not a same-origin path: " + u);
}

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs?: Attrs | null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  let value: string | undefined;
  if (attrs) {
    for (const name of Object.keys(attrs)) {
      const v = attrs[name];
      if (v === null || v === undefined || v === false) continue;
      const lower = name.toLowerCase();
      if (lower.startsWith("on") || lower === "style" || lower === "srcdoc") {
        throw new Error("h: attribute " + name + " is not allowed");
      }
      if (lower === "value") {
        value = String(v);
        continue;
      }
      const s = v === true ? "" : String(v);
      el.setAttribute(name, urlAttrs.has(lower) ? safeURL(s) : s);
    }
  }
  append(el, children);
  // After the children, so a select's options exist when its value is set.
  if (value !== undefined) (el as unknown as { value: string }).value = value;
  return el;
}

export function append(parent: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(parent, c);
    else if (typeof c === "string" || typeof c === "number") parent.appendChild(document.createTextNode(String(c)));
    else parent.appendChild(c);
  }
}

// replace empties el and puts children in it.
export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}

export function listen<E extends EventTarget, K extends keyof HTMLElementEventMap>(
  el: E,
  type: K,
  fn: (ev: HTMLElementEventMap[K]) => void,
): E {
  el.addEventListener(type, fn as EventListener);
  return el;
}

// A labelled form control: <div class="field"><label for=ID>…</label>CONTROL hint</div>.
export function field(label: string, control: HTMLElement, hint?: string): HTMLDivElement {
  const id = control.id;
  if (!id) throw new Error("field: the control needs an id");
  let hintEl: HTMLElement | null = null;
  if (hint) {
    hintEl = h("small", { class: "hint", id: id + "-hint" }, hint);
    control.setAttribute("aria-describedby", hintEl.id);
  }
  return h("div", { class: "field" }, h("label", { for: id }, label), control, hintEl);
}

// A table in a horizontally scrollable, keyboard-focusable wrapper.
export function tableWrap(label: string, table: HTMLTableElement): HTMLDivElement {
  return h("div", { class: "table-wrap", role: "region", "aria-label": label + " (table)", tabindex: 0 }, table);
}

export function thead(...names: string[]): HTMLTableSectionElement {
  return h("thead", null, h("tr", null, names.map((n) => h("th", { scope: "col" }, n))));
}

// An empty-table row spanning cols columns.
export function emptyRow(cols: number, text: string): HTMLTableRowElement {
  return h("tr", { class: "empty" }, h("td", { colspan: cols }, text));
}

// time renders an RFC 3339 time as "2026-01-02 15:04:05Z" in a <time>.
export function time(s?: string): Node {
  if (!s) return document.createTextNode("—");
  const d = new Date(s);
  const shown = isNaN(d.getTime()) ? s : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  return h("time", { datetime: s }, shown);
}

// pairs shows a string map as "k=v, k=v" sorted by key.
export function pairs(m?: Record<string, string> | null): string {
  if (!m) return "";
  return Object.keys(m)
    .sort()
    .map((k) => k + "=" + m[k])
    .join(", ");
}

export function bytes(n: number): string {
  if (!isFinite(n)) return "";
  if (n < 1024) return n + " B";
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = -1;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (Math.round(v * 10) / 10).toString() + " " + units[i];
}

// parsePairs reads "key=value" lines (or another separator's items).
export function parsePairs(text: string, sep: RegExp = /\r?\n/): Record<string, string> | string {
  const entries: [string, string][] = [];
  for (const raw of text.split(sep)) {
    const line = raw.trim();
    if (!line) continue;
    const eq = line.indexOf("=");
    if (eq <= 0) return "Write each label as key=value: " + line;
    entries.push([line.slice(0, eq).trim(), line.slice(eq + 1).trim()]);
  }
  // fromEntries defines own properties: a key "__proto__" stays a key.
  return Object.fromEntries(entries);
}

// list reads a comma-separated list, without empty items.
export function list(text: string): string[] {
  return text
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
}

// KeyedRows keeps a tbody's rows in step with a list of items, replacing
// only the rows whose content changed, so a refresh every few seconds
// neither flickers nor takes the keyboard focus away from a row's button.
export class KeyedRows<T> {
  private rows = new Map<string, { sig: string; el: HTMLElement }>();

  constructor(
    private readonly body: HTMLElement,
    private readonly key: (t: T) => string,
    private readonly sig: (t: T) => string,
    private readonly render: (t: T) => HTMLElement,
    private readonly empty: () => HTMLElement,
  ) {}

  update(items: T[]): void {
    const next = new Map<string, { sig: string; el: HTMLElement }>();
    const els: HTMLElement[] = [];
    let refocus: { el: HTMLElement; action: string | null } | null = null;
    for (const item of items) {
      const k = this.key(item);
      if (next.has(k)) continue;
      const s = this.sig(item);
      const old = this.rows.get(k);
      let el: HTMLElement;
      if (old && old.sig === s) {
        el = old.el;
      } else {
        el = this.render(item);
        const active = document.activeElement;
        if (old && active instanceof HTMLElement && old.el.contains(active)) {
          refocus = { el, action: active.getAttribute("data-action") };
        }
      }
      next.set(k, { sig: s, el });
      els.push(el);
    }
    if (els.length === 0) els.push(this.empty());
    const keep = new Set<Node>(els);
    for (const child of Array.from(this.body.children)) {
      if (!keep.has(child)) child.remove();
    }
    els.forEach((el, i) => {
      if (this.body.children[i] !== el) this.body.insertBefore(el, this.body.children[i] ?? null);
    });
    this.rows = next;
    if (refocus) {
      const target =
        (refocus.action && refocus.el.querySelector<HTMLElement>(`[data-action="${CSS.escape(refocus.action)}"]`)) ||
        refocus.el.querySelector<HTMLElement>("button");
      target?.focus();
    }
  }
}
