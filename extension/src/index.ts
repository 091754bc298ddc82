import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import {
  INotebookModel,
  INotebookTracker,
  NotebookPanel
} from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';
import { IDisposable } from '@lumino/disposable';

import { keepCleanWhenKernelFillsIn } from './cleanopen';
import { monitorIcon } from './icons';
import { IKernelMessage, KernelLink } from './link';
import { MonitorPanel } from './monitorpanel';
import { ModePicker } from './picker';
import { ModeStatus } from './statusitem';

const OPEN_MONITOR = 'tpunb:open-monitor';

/**
 * Gives every notebook a link to tpunb in its kernel and a mode picker in its toolbar, and
 * keeps a notebook opened unchanged from reading as modified (cleanopen.ts).
 * The link lives as long as the notebook panel; the picker is disabled until tpunb loads.
 */
class NotebookLinks implements DocumentRegistry.IWidgetExtension<
  NotebookPanel,
  INotebookModel
> {
  constructor(private readonly _trans: TranslationBundle) {}

  createNew(
    panel: NotebookPanel,
    context: DocumentRegistry.IContext<INotebookModel>
  ): IDisposable {
    keepCleanWhenKernelFillsIn(context.model);
    const link = new KernelLink(panel.sessionContext, () =>
      cellsRunning(panel)
    );
    const picker = new ModePicker(link, this._trans);
    panel.toolbar.insertItem(10, 'tpunbMode', picker);
    this._links.set(panel, link);
    link.received.connect(showErrors);
    panel.disposed.connect(() => {
      this._links.delete(panel);
      link.dispose();
    });
    return picker;
  }

  linkOf(panel: NotebookPanel | null): KernelLink | null {
    return panel ? (this._links.get(panel) ?? null) : null;
  }

  private _links = new Map<NotebookPanel, KernelLink>();
}

/** Whether cells of this notebook are running or queued (a Run All queues them all). */
function cellsRunning(panel: NotebookPanel): boolean {
  // a code cell's model has executionState (@jupyterlab/cells' ICodeCellModel)
  return panel.content.widgets.some(
    cell =>
      (cell.model as { executionState?: string }).executionState === 'running'
  );
}

/** A request the kernel refused (an unknown mode, one this runtime cannot run). */
function showErrors(_: KernelLink, message: IKernelMessage): void {
  if (message.type === 'error') {
    Notification.error(String(message.message), { autoClose: 8000 });
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'tpunb-lab:plugin',
  description:
    "tpunb in JupyterLab: the kernel's mode and memory in the status bar, a mode picker in the notebook toolbar, the live monitor in a side panel",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ILabShell, ITranslator, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    translator: ITranslator | null,
    palette: ICommandPalette | null
  ) => {
    const trans = (translator ?? nullTranslator).load('tpunb_lab');
    const links = new NotebookLinks(trans);
    app.docRegistry.addWidgetExtension('Notebook', links);

    // in the right side bar from the start (its icon), fed by the kernel only while shown;
    // also the status item's click, the command palette and the View menu (schema/plugin.json)
    const monitor = new MonitorPanel(trans);
    app.shell.add(monitor, 'right', { rank: 900 });
    app.commands.addCommand(OPEN_MONITOR, {
      label: trans.__('tpunb: Show the Live Monitor'),
      icon: monitorIcon,
      describedBy: { args: { type: 'object', properties: {} } },
      execute: () => {
        if (!monitor.isAttached) {
          app.shell.add(monitor, 'right', { rank: 900 });
        }
        app.shell.activateById(monitor.id);
      }
    });
    palette?.addItem({ command: OPEN_MONITOR, category: 'tpunb' });

    const status = new ModeStatus(
      () => void app.commands.execute(OPEN_MONITOR)
    );
    const followCurrent = () => {
      const link = links.linkOf(notebooks.currentWidget);
      status.follow(link);
      monitor.follow(link);
    };
    notebooks.currentChanged.connect(followCurrent);
    // a notebook's link exists once its panel is made; the tracker may announce it first
    notebooks.widgetAdded.connect(() => queueMicrotask(followCurrent));
    labShell?.currentChanged.connect(followCurrent);
    followCurrent();

    statusBar?.registerStatusItem('tpunb-lab:status', {
      item: status,
      align: 'left',
      rank: 4,
      isActive: () => status.isActive,
      activeStateChanged: status.activeChanged
    });
  }
};

export default plugin;
