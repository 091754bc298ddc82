import { LabIcon } from '@jupyterlab/ui-components';

/**
 * The live monitor's icon (a screen with a rising line), in the side bar from the start and
 * beside its command: `jp-icon3` takes the theme's icon colour.
 */
export const monitorIcon = new LabIcon({
  name: 'tpunb-lab:monitor',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M3 4h18a1 1 0 0 1 1 1v12a1 1 0 0 1-1 1h-7v2h3v2H7v-2h3v-2H3a1 1 0 0 1-1-1V5a1 1 0 0 1 1-1zm1 2v10h16V6H4z"/>' +
    '<path d="M5 14l3.5-4 3 2.5L15 8l4 4.5-1.4 1.3-2.6-3-3.4 4.2-3-2.5L6.5 15.3z"/>' +
    '</g></svg>'
});
