import { Widget } from '@lumino/widgets';
import { ISignal, Signal } from '@lumino/signaling';

import { KernelLink } from './link';
import { IKernelState, statusText, statusTitle } from './state';

/**
 * The status bar item: `tpunb · fused · HBM 3.1 / 16 GiB` for the current notebook's kernel.
 * It is active only while that kernel has tpunb loaded; a click runs `onClick` (the monitor).
 */
export class ModeStatus extends Widget {
  constructor(private readonly _onClick: () => void) {
    super();
    this.addClass('tpunb-ModeStatus');
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', () => this._onClick());
  }

  /** Fires when the item should appear or disappear. */
  get activeChanged(): ISignal<this, void> {
    return this._activeChanged;
  }

  get isActive(): boolean {
    return this._link?.state !== null && this._link?.state !== undefined;
  }

  /** Follow another notebook's kernel (null: no notebook is current). */
  follow(link: KernelLink | null): void {
    this._link?.stateChanged.disconnect(this._render, this);
    this._link = link;
    link?.stateChanged.connect(this._render, this);
    this._render();
  }

  private _render(): void {
    const state: IKernelState | null = this._link?.state ?? null;
    this.node.textContent = state ? statusText(state) : '';
    this.node.title = state ? statusTitle(state) : '';
    this.node.dataset.mode = state?.mode ?? '';
    if (this.isActive !== this._wasActive) {
      this._wasActive = this.isActive;
      this._activeChanged.emit();
    }
  }

  private _link: KernelLink | null = null;
  private _wasActive = false;
  private _activeChanged = new Signal<this, void>(this);
}
