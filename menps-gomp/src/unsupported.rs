//! libgomp entry points this runtime does not offer: each aborts with its
//! name, so that a program needing one fails loudly instead of reaching
//! libgomp (when preloaded, an entry point missing here would bind to
//! libgomp's, which knows nothing of this runtime's teams).

/// Defines each entry point as a function that aborts with its name.
macro_rules! unsupported {
    ($($name:ident)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported; aborts with its name.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> ! {
            crate::die(concat!(
                stringify!($name),
                " is not supported by this OpenMP runtime (menps-gomp)"
            ))
        }
    )*};
}

unsupported! {
    GOACC_data_end GOACC_data_start GOACC_declare GOACC_enter_data GOACC_enter_exit_data
    GOACC_exit_data GOACC_get_num_threads GOACC_get_thread_num GOACC_parallel
    GOACC_parallel_keyed GOACC_update GOACC_wait GOMP_PLUGIN_acc_default_dim
    GOMP_PLUGIN_acc_thread GOMP_PLUGIN_async_unmap_vars GOMP_PLUGIN_debug GOMP_PLUGIN_error
    GOMP_PLUGIN_fatal GOMP_PLUGIN_goacc_profiling_dispatch GOMP_PLUGIN_goacc_thread
    GOMP_PLUGIN_malloc GOMP_PLUGIN_malloc_cleared GOMP_PLUGIN_realloc
    GOMP_PLUGIN_target_task_completion GOMP_doacross_post GOMP_doacross_ull_post
    GOMP_doacross_ull_wait GOMP_doacross_wait GOMP_error GOMP_loop_doacross_dynamic_start
    GOMP_loop_doacross_guided_start GOMP_loop_doacross_runtime_start GOMP_loop_doacross_start
    GOMP_loop_doacross_static_start GOMP_loop_ull_doacross_dynamic_start
    GOMP_loop_ull_doacross_guided_start GOMP_loop_ull_doacross_runtime_start
    GOMP_loop_ull_doacross_start GOMP_loop_ull_doacross_static_start GOMP_offload_register
    GOMP_offload_register_ver GOMP_offload_unregister GOMP_offload_unregister_ver

    GOMP_parallel_reductions
    GOMP_scope_start GOMP_target GOMP_target_data
    GOMP_target_data_ext GOMP_target_end_data GOMP_target_enter_exit_data GOMP_target_ext
    GOMP_target_update GOMP_target_update_ext GOMP_task_reduction_remap
    GOMP_taskgroup_reduction_register GOMP_taskgroup_reduction_unregister GOMP_taskloop
    GOMP_taskloop_ull GOMP_taskwait_depend GOMP_teams GOMP_teams4 GOMP_teams_reg GOMP_warning
    GOMP_workshare_task_reduction_unregister acc_async_test acc_async_test_all
    acc_async_test_all_h_ acc_async_test_h_ acc_async_wait acc_async_wait_all acc_attach
    acc_attach_async acc_copyin acc_copyin_32_h_ acc_copyin_64_h_ acc_copyin_array_h_
    acc_copyin_async acc_copyin_async_32_h_ acc_copyin_async_64_h_ acc_copyin_async_array_h_
    acc_copyout acc_copyout_32_h_ acc_copyout_64_h_ acc_copyout_array_h_ acc_copyout_async
    acc_copyout_async_32_h_ acc_copyout_async_64_h_ acc_copyout_async_array_h_
    acc_copyout_finalize acc_copyout_finalize_32_h_ acc_copyout_finalize_64_h_
    acc_copyout_finalize_array_h_ acc_copyout_finalize_async acc_create acc_create_32_h_
    acc_create_64_h_ acc_create_array_h_ acc_create_async acc_create_async_32_h_
    acc_create_async_64_h_ acc_create_async_array_h_ acc_delete acc_delete_32_h_
    acc_delete_64_h_ acc_delete_array_h_ acc_delete_async acc_delete_async_32_h_
    acc_delete_async_64_h_ acc_delete_async_array_h_ acc_delete_finalize
    acc_delete_finalize_32_h_ acc_delete_finalize_64_h_ acc_delete_finalize_array_h_
    acc_delete_finalize_async acc_detach acc_detach_async acc_detach_finalize
    acc_detach_finalize_async acc_deviceptr acc_free acc_get_cuda_stream
    acc_get_current_cuda_context acc_get_current_cuda_device acc_get_device_num
    acc_get_device_num_h_ acc_get_device_type acc_get_device_type_h_ acc_get_num_devices
    acc_get_num_devices_h_ acc_get_property acc_get_property_h_ acc_get_property_string
    acc_get_property_string_h_ acc_hostptr acc_init acc_init_h_ acc_is_present
    acc_is_present_32_h_ acc_is_present_64_h_ acc_is_present_array_h_ acc_malloc acc_map_data
    acc_memcpy_from_device acc_memcpy_from_device_async acc_memcpy_to_device
    acc_memcpy_to_device_async acc_on_device acc_on_device_h_ acc_pcopyin acc_pcreate
    acc_present_or_copyin acc_present_or_copyin_32_h_ acc_present_or_copyin_64_h_
    acc_present_or_copyin_array_h_ acc_present_or_create acc_present_or_create_32_h_
    acc_present_or_create_64_h_ acc_present_or_create_array_h_ acc_prof_lookup acc_prof_register
    acc_prof_unregister acc_register_library acc_set_cuda_stream acc_set_device_num
    acc_set_device_num_h_ acc_set_device_type acc_set_device_type_h_ acc_shutdown
    acc_shutdown_h_ acc_unmap_data acc_update_device acc_update_device_32_h_
    acc_update_device_64_h_ acc_update_device_array_h_ acc_update_device_async
    acc_update_device_async_32_h_ acc_update_device_async_64_h_ acc_update_device_async_array_h_
    acc_update_self acc_update_self_32_h_ acc_update_self_64_h_ acc_update_self_array_h_
    acc_update_self_async acc_update_self_async_32_h_ acc_update_self_async_64_h_
    acc_update_self_async_array_h_ acc_wait acc_wait_all acc_wait_all_async
    acc_wait_all_async_h_ acc_wait_all_h_ acc_wait_async acc_wait_async_h_ acc_wait_h_
    omp_capture_affinity omp_capture_affinity_ omp_destroy_allocator omp_destroy_allocator_
    omp_destroy_lock_ omp_destroy_nest_lock_ omp_display_affinity omp_display_affinity_
    omp_display_env omp_display_env_ omp_display_env_8_ omp_fulfill_event omp_fulfill_event_
    omp_get_active_level_ omp_get_affinity_format omp_get_affinity_format_
    omp_get_ancestor_thread_num_ omp_get_ancestor_thread_num_8_ omp_get_cancellation_
    omp_get_default_allocator_ omp_get_default_device_ omp_get_device_num_ omp_get_dynamic_
    omp_get_initial_device_ omp_get_level_ omp_get_max_active_levels_ omp_get_max_task_priority_
    omp_get_max_teams omp_get_max_teams_ omp_get_max_threads_ omp_get_nested_
    omp_get_num_devices_ omp_get_num_places_ omp_get_num_procs_ omp_get_num_teams_
    omp_get_num_threads_ omp_get_partition_num_places_
    omp_get_partition_place_nums_ omp_get_partition_place_nums_8_ omp_get_place_num_
    omp_get_place_num_procs_ omp_get_place_num_procs_8_
    omp_get_place_proc_ids_ omp_get_place_proc_ids_8_ omp_get_proc_bind_
    omp_get_schedule_ omp_get_schedule_8_ omp_get_supported_active_levels_ omp_get_team_num_
    omp_get_team_size_ omp_get_team_size_8_ omp_get_teams_thread_limit
    omp_get_teams_thread_limit_ omp_get_thread_limit_ omp_get_thread_num_ omp_get_wtick_
    omp_get_wtime_ omp_in_final_ omp_in_parallel_ omp_init_allocator omp_init_allocator_
    omp_init_allocator_8_ omp_init_lock_ omp_init_nest_lock_ omp_is_initial_device_
    omp_pause_resource omp_pause_resource_ omp_pause_resource_all omp_pause_resource_all_
    omp_set_affinity_format omp_set_affinity_format_ omp_set_default_allocator_
    omp_set_default_device_ omp_set_default_device_8_ omp_set_dynamic_ omp_set_dynamic_8_
    omp_set_lock_ omp_set_max_active_levels_ omp_set_max_active_levels_8_ omp_set_nest_lock_
    omp_set_nested_ omp_set_nested_8_ omp_set_num_teams omp_set_num_teams_ omp_set_num_teams_8_
    omp_set_num_threads_ omp_set_num_threads_8_ omp_set_schedule_ omp_set_schedule_8_
    omp_set_teams_thread_limit omp_set_teams_thread_limit_ omp_set_teams_thread_limit_8_
    omp_target_alloc omp_target_associate_ptr omp_target_disassociate_ptr omp_target_free
    omp_target_is_present omp_target_memcpy omp_target_memcpy_rect omp_test_lock_
    omp_test_nest_lock_ omp_unset_lock_ omp_unset_nest_lock_
}
