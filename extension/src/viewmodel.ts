/**
 * The slice of an anywidget model that tpunb's monitor view uses (`get`, `on`, `off`,
 * `send`), backed by the tpunb comm instead of a widget comm. With it the side panel runs
 * the very view module the notebook widget runs (tpunb/monitoring/monitor.js).
 */
export type Listener = () => void;

export class ViewModel {
  constructor(
    private readonly _send: (message: Record<string, unknown>) => void
  ) {}

  get(name: string): unknown {
    return this._values.get(name);
  }

  /** Set a value and tell the view (`change:NAME`). */
  set(name: string, value: unknown): void {
    this._values.set(name, value);
    for (const listener of this._listeners.get(`change:${name}`) ?? []) {
      listener();
    }
  }

  on(event: string, listener: Listener): void {
    const listeners = this._listeners.get(event) ?? new Set<Listener>();
    listeners.add(listener);
    this._listeners.set(event, listeners);
  }

  off(event: string, listener: Listener): void {
    this._listeners.get(event)?.delete(listener);
  }

  /** A custom message from the view to the kernel (the monitor's group click). */
  send(message: Record<string, unknown>): void {
    this._send(message);
  }

  private _values = new Map<string, unknown>();
  private _listeners = new Map<string, Set<Listener>>();
}
