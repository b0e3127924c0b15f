// bootstrap-toc's `Toc.init`, which pkgdown.js calls to fill the "On this
// page" sidebar: pkgdown loads bootstrap-toc from a CDN, and no package
// registry carries it. Level-2 headings, with their level-3 ones nested.
window.Toc = window.Toc || {
  init: function (options) {
    var $nav = options.$nav;
    if (!$nav || !$nav.length) return;
    var $list = $('<ul class="nav nav-pills flex-column"></ul>');
    var $section = null;
    options.$scope.filter("h2, h3").each(function () {
      var $heading = $(this);
      var id = $heading.attr("id") || $heading.parent().attr("id");
      if (!id) return;
      var $item = $('<li class="nav-item"></li>').append(
        $('<a class="nav-link"></a>').attr("href", "#" + id).text($heading.text()));
      if (this.tagName === "H2" || !$section) {
        $list.append($item);
        $section = $item;
      } else {
        var $sub = $section.children("ul");
        if (!$sub.length) {
          $sub = $('<ul class="nav nav-pills flex-column"></ul>').appendTo($section);
        }
        $sub.append($item);
      }
    });
    $nav.append($list);
  }
};
