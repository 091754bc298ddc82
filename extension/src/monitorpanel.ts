import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { monitorIcon } from './icons';
import { IKernelMessage, KernelLink } from './link';
import { ViewModel } from './viewmodel';

/** What an anywidget ES module exports (tpunb's monitor view is one). */
interface IViewModule {
  render(options: { model: ViewModel; el: HTMLElement }): (() => void) | void;
}

/**
 * The live monitor in the right side panel, for the current notebook's kernel.
 *
 * While the panel is visible it asks that kernel's tpunb for monitor ticks; the kernel
 * sends the monitor widget's own view code first, so the panel shows exactly what
 * `tpunb.monitor()` shows in a notebook. Hidden, it tells the kernel to stop sending.
 */
export class MonitorPanel extends Widget {
  constructor(private readonly _trans: TranslationBundle) {
    super();
    this.id = 'tpunb-monitor';
    this.title.icon = monitorIcon; // the side bar shows the icon alone, as for JupyterLab's own
    this.title.caption = _trans.__('tpunb live monitor');
    this.addClass('tpunb-MonitorPanel');
    this._style = document.createElement('style');
    this._body = document.createElement('div');
    this._body.className = 'tpunb-MonitorPanel-body';
    this.node.append(this._style, this._body);
    this._showWaiting();
  }

  /** Show another notebook's kernel (null: none is current). */
  follow(link: KernelLink | null): void {
    if (link === this._link) {
      return;
    }
    this._subscribe(false);
    this._link?.received.disconnect(this._onMessage, this);
    this._link?.stateChanged.disconnect(this._onState, this);
    this._link = link;
    link?.received.connect(this._onMessage, this);
    link?.stateChanged.connect(this._onState, this);
    this._clearView();
    this._subscribe(this.isVisible);
  }

  protected onAfterShow(): void {
    this._subscribe(true);
  }

  protected onAfterHide(): void {
    this._subscribe(false);
  }

  protected onBeforeDetach(): void {
    this._subscribe(false);
  }

  /**
   * Tell the kernel whether to feed this panel (only a kernel with tpunb can), again when the
   * link's comm changed: the kernel feeds the comm a request came on, and a subscription made
   * on a comm the page then closed (two opened at once after a restart) fed nothing.
   */
  private _subscribe(open: boolean): void {
    const wanted = open && Boolean(this._link?.state);
    const comm = wanted ? (this._link?.commId ?? null) : null;
    if (wanted !== this._open || comm !== this._openOn) {
      this._open = wanted;
      this._openOn = comm;
      this._link?.send({ type: 'monitor', open: wanted });
    }
  }

  private _onState(): void {
    if (this._link?.state === null) {
      this._open = false;
      this._openOn = null;
      this._clearView();
    } else if (this.isVisible) {
      this._subscribe(true);
    }
  }

  private _onMessage(_: KernelLink, message: IKernelMessage): void {
    if (message.type === 'monitor_view') {
      void this._mount(String(message.esm), String(message.css));
    } else if (message.type === 'monitor') {
      this._model?.set('state', message.state);
    } else if (message.type === 'graph') {
      this._model?.set('graph', { key: message.key, code: message.code });
    }
  }

  /** Load the view module the kernel sent (as anywidget does: an ES module from a blob). */
  private async _mount(esm: string, css: string): Promise<void> {
    const link = this._link;
    if (!link) {
      return;
    }
    const url = URL.createObjectURL(
      new Blob([esm], { type: 'text/javascript' })
    );
    let module: { default: IViewModule };
    try {
      module = await import(/* webpackIgnore: true */ url);
    } finally {
      URL.revokeObjectURL(url);
    }
    if (link !== this._link) {
      return; // the current notebook changed while the module loaded
    }
    this._clearView();
    this._body.replaceChildren();
    this._style.textContent = css;
    this._model = new ViewModel(message =>
      link.send(message as IKernelMessage)
    );
    const cleanup = module.default.render({
      model: this._model,
      el: this._body
    });
    this._cleanup = typeof cleanup === 'function' ? cleanup : null;
  }

  private _clearView(): void {
    this._cleanup?.();
    this._cleanup = null;
    this._model = null;
    this._showWaiting();
  }

  private _showWaiting(): void {
    const text = this._link?.state
      ? this._trans.__('Waiting for the kernel…')
      : this._trans.__(
          'Load tpunb in the current notebook (%load_ext tpunb) to see its live monitor here.'
        );
    const note = document.createElement('p');
    note.className = 'tpunb-MonitorPanel-waiting';
    note.textContent = text;
    this._body.replaceChildren(note);
  }

  private _link: KernelLink | null = null;
  private _open = false;
  private _openOn: string | null = null; // the comm the kernel was asked to feed
  private _model: ViewModel | null = null;
  private _cleanup: (() => void) | null = null;
  private _style: HTMLStyleElement;
  private _body: HTMLDivElement;
}
