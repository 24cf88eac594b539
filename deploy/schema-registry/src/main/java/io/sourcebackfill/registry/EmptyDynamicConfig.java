package io.sourcebackfill.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

/**
 * The one bean of apicurio-common-app-components-config-index, which this build leaves out (its Quarkus
 * deployment half is not on Maven Central): the list of the registry's properties changeable at run time,
 * empty here, so every property keeps the value it starts with.
 */
@Singleton
public class EmptyDynamicConfig {

    @Produces
    @Singleton
    DynamicConfigPropertyList dynamicConfigProperties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
