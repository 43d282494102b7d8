// Poller runs fn now and then every ms after each run ends (never two at
// once), until stop. now() runs it again at once (after the run under way).
export class Poller {
  private timer: number | undefined;
  private running = false;
  private again = false;
  private stopped = false;

  constructor(
    private readonly fn: () => Promise<void>,
    private readonly ms: number,
  ) {}

  async now(): Promise<void> {
    if (this.stopped) return;
    window.clearTimeout(this.timer);
    this.timer = undefined;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = true;
    try {
      await this.fn();
    } catch {
      // fn shows its own errors.
    } finally {
      this.running = false;
    }
    if (this.stopped) return;
    if (this.again) {
      this.again = false;
      void this.now();
      return;
    }
    this.timer = window.setTimeout(() => void this.now(), this.ms);
  }

  stop(): void {
    this.stopped = true;
    window.clearTimeout(this.timer);
    this.timer = undefined;
  }
}

// debounce calls fn once ms after the last call.
export function debounce(fn: () => void, ms: number): { (): void; cancel(): void } {
  let t: number | undefined;
  const d = () => {
    window.clearTimeout(t);
    t = window.setTimeout(fn, ms);
  };
  d.cancel = () => window.clearTimeout(t);
  return d;
}

// sleep resolves after ms, or at once when signal aborts.
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = window.setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      window.clearTimeout(t);
      resolve();
    });
  });
}
